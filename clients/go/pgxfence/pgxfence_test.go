package pgxfence

// Against a real server with pg_fencing preloaded (tests/goclient/run.sh): PGFENCING_TEST_DSN
// (a URL) and PGFENCING_TEST_LOG (the server's log, log_statement = all, '[%a] ' prefix).

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	pgfencing "github.com/pg-fencing/pg_fencing/clients/go"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

func dsn(t *testing.T) string {
	d := os.Getenv("PGFENCING_TEST_DSN")
	if d == "" {
		t.Fatal("PGFENCING_TEST_DSN is not set: run tests/goclient/run.sh")
	}
	return d
}

func connect(t *testing.T, app string) *pgx.Conn {
	cfg, err := pgx.ParseConfig(dsn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func exec(t *testing.T, c *pgx.Conn, q string, args ...interface{}) {
	t.Helper()
	if _, err := c.Exec(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func value(t *testing.T, c *pgx.Conn, q string, args ...interface{}) int64 {
	t.Helper()
	var v int64
	if err := c.QueryRow(context.Background(), q, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v
}

func setup(t *testing.T, table, resource string, mark int64) *pgx.Conn {
	admin := connect(t, "admin")
	exec(t, admin, "CREATE TABLE "+table+" (id int PRIMARY KEY, v int)")
	exec(t, admin, "SELECT fencing_protect($1, $2)", table, resource)
	exec(t, admin, "SELECT fencing_advance($1, $2)", resource, mark)
	return admin
}

func update(q string, args ...interface{}) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, q, args...)
		return err
	}
}

func TestFenced(t *testing.T) {
	ctx := context.Background()
	admin := setup(t, "gx_acct", "gx", 10)
	c := connect(t, "gx_client")
	if err := Fenced(ctx, c, 10, update("INSERT INTO gx_acct VALUES (1, 1)")); err != nil {
		t.Fatalf("a fenced transaction: %v", err)
	}
	if v := value(t, admin, "SELECT fence_token FROM gx_acct WHERE id = 1"); v != 10 {
		t.Errorf("the row's token is %d, want 10", v)
	}
	err := Fenced(ctx, c, 9, update("UPDATE gx_acct SET v = 2 WHERE id = 1"))
	var fe *pgfencing.Error
	if !errors.Is(err, pgfencing.ErrStaleToken) || !errors.As(err, &fe) {
		t.Fatalf("a stale token: %v, want ErrStaleToken", err)
	}
	if fe.Token != 9 || fe.HighWater != 10 || fe.Resource != "gx" || !fe.Superseded() {
		t.Errorf("the stale token's fields: %+v", fe)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "FT001" {
		t.Errorf("the driver's error is unwrapped from it: %v", err)
	}
	if v := value(t, admin, "SELECT v FROM gx_acct WHERE id = 1"); v != 1 {
		t.Errorf("the refused transaction left v = %d", v)
	}
	if s := c.PgConn().TxStatus(); s != 'I' {
		t.Errorf("the connection is left in transaction status %c", s)
	}
	_, err = c.Exec(ctx, "UPDATE gx_acct SET v = 3 WHERE id = 1")
	if !errors.Is(FromError(err), pgfencing.ErrNoToken) {
		t.Errorf("the same connection after a fenced transaction carries no token: %v", err)
	}
	mine := errors.New("the handler failed")
	err = Fenced(ctx, c, 10, func(ctx context.Context, c *pgx.Conn) error {
		if _, err := c.Exec(ctx, "UPDATE gx_acct SET v = 4 WHERE id = 1"); err != nil {
			return err
		}
		return mine
	})
	if err != mine {
		t.Errorf("fn's error comes back unchanged: %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("a panic in fn propagates")
			}
		}()
		_ = Fenced(ctx, c, 10, func(ctx context.Context, c *pgx.Conn) error {
			_, _ = c.Exec(ctx, "UPDATE gx_acct SET v = 5 WHERE id = 1")
			panic("boom")
		})
	}()
	if v := value(t, admin, "SELECT v FROM gx_acct WHERE id = 1"); v != 1 {
		t.Errorf("an error or a panic in fn rolled back: v = %d", v)
	}
	exec(t, c, "BEGIN")
	if err := Fenced(ctx, c, 10, update("UPDATE gx_acct SET v = 6 WHERE id = 1")); err == nil {
		t.Errorf("Fenced on a connection in a transaction is refused")
	}
	exec(t, c, "ROLLBACK")
	if err := Fenced(ctx, c, 0, update("UPDATE gx_acct SET v = 6 WHERE id = 1")); !errors.Is(err, pgfencing.ErrBadToken) {
		t.Errorf("token 0 is refused before anything is sent: %v", err)
	}
}

func statements(t *testing.T, app string) int {
	b, err := os.ReadFile(os.Getenv("PGFENCING_TEST_LOG"))
	if err != nil {
		t.Fatalf("PGFENCING_TEST_LOG: %v", err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "["+app+"]") && (strings.Contains(l, "LOG:  statement:") || strings.Contains(l, "LOG:  execute")) {
			n++
		}
	}
	return n
}

func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	admin := setup(t, "gx_rt", "gx_rt", 10)
	exec(t, admin, "CREATE TABLE gx_plain (id int PRIMARY KEY, v int)")
	exec(t, admin, "INSERT INTO gx_plain VALUES (1, 0)")
	exec(t, admin, "BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO gx_rt VALUES (1, 0); COMMIT")
	f := connect(t, "gx_rt_fenced")
	u := connect(t, "gx_rt_plain")
	if err := Fenced(ctx, f, 10, update("UPDATE gx_rt SET v = v + 1 WHERE id = $1", 1)); err != nil {
		t.Fatal(err)
	}
	tx, err := u.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE gx_plain SET v = v + 1 WHERE id = $1", 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	nf, nu := statements(t, "gx_rt_fenced"), statements(t, "gx_rt_plain")
	if nf != nu || nf == 0 {
		t.Errorf("a fenced transaction sends as many statements as an unfenced one: %d and %d", nf, nu)
	}
	t.Logf("statements: fenced %d, unfenced (pgx's Begin/Commit) %d", nf, nu)
}

func pool(t *testing.T) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(dsn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	p, err := pgxpool.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestPool(t *testing.T) {
	ctx := context.Background()
	setup(t, "gx_pool", "gx_pool", 10)
	p := pool(t)
	exec(t, connect(t, "admin"), "BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO gx_pool VALUES (1, 0); COMMIT")
	if err := FencedPool(ctx, p, 10, update("UPDATE gx_pool SET v = v + 1 WHERE id = 1")); err != nil {
		t.Fatal(err)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, "UPDATE gx_pool SET v = v + 1 WHERE id = 1")
	c.Release()
	if !errors.Is(FromError(err), pgfencing.ErrNoToken) {
		t.Errorf("the next borrower's write without a token is refused (FT002): %v", err)
	}
	if err := FencedPool(ctx, p, 3, update("UPDATE gx_pool SET v = 0 WHERE id = 1")); !errors.Is(err, pgfencing.ErrStaleToken) {
		t.Errorf("a stale token through the pool: %v", err)
	}
	if s := p.Stat(); s.TotalConns() != 1 || s.IdleConns() != 1 {
		t.Errorf("the pool got its connection back: total %d idle %d", s.TotalConns(), s.IdleConns())
	}
}

func TestEveryCode(t *testing.T) {
	ctx := context.Background()
	c := connect(t, "admin")
	for _, s := range []*pgfencing.Error{pgfencing.ErrStaleToken, pgfencing.ErrNoToken, pgfencing.ErrLeaseLost,
		pgfencing.ErrProtectionInactive, pgfencing.ErrLockServiceUnavailable, pgfencing.ErrNotCurrentHolder} {
		_, err := c.Exec(ctx, "DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '"+s.Code+"'; END $$")
		if fe := FromError(err); fe == nil || !errors.Is(fe, s) || fe.Code != s.Code {
			t.Errorf("%s: %v", s.Code, err)
		}
	}
	_, err := c.Exec(ctx, "SELECT 1/0")
	if FromError(err) != nil {
		t.Errorf("22012 is not a fencing error")
	}
}

func TestLease(t *testing.T) {
	ctx := context.Background()
	admin := setup(t, "gx_lease", "gx_lease", 1)
	p := pool(t)
	l, err := AcquireLease(ctx, p, "gx-lease", 1200*time.Millisecond, pgfencing.LeaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exec(t, admin, "SELECT fencing_advance('gx_lease', $1)", l.Token())
	time.Sleep(2 * time.Second)
	if l.Err() != nil {
		t.Fatalf("renewed past its TTL, it is not lost: %v", l.Err())
	}
	if err := FencedPool(ctx, p, l.Token(), update("INSERT INTO gx_lease VALUES (1, 8)")); err != nil {
		t.Fatalf("a write with the live lease's token: %v", err)
	}
	exec(t, admin, "SELECT pg_terminate_backend(holder_pid) FROM fencing_leases WHERE name = 'gx-lease'")
	select {
	case <-l.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("a lease whose renewal fails cancels its Context")
	}
	if !errors.Is(l.Check(), pgfencing.ErrLeaseLost) {
		t.Errorf("Check() after the loss: %v", l.Check())
	}
	if ok, _ := l.Release(ctx); ok {
		t.Errorf("Release of a lost lease is false")
	}
	time.Sleep(1300 * time.Millisecond)
	if err := FencedPool(ctx, p, l.Token(), update("UPDATE gx_lease SET v = 9 WHERE id = 1")); !errors.Is(err, pgfencing.ErrLeaseLost) {
		t.Errorf("the lost lease's token, expired, is refused by the server (FT003): %v", err)
	}
	held, err := AcquireLease(ctx, p, "gx-held", 5*time.Second, pgfencing.LeaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = AcquireLease(ctx, p, "gx-held", 5*time.Second, pgfencing.LeaseOptions{})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55P03" {
		t.Errorf("a held lease without waiting: 55P03, got %v", err)
	}
	if ok, err := held.Release(ctx); !ok || err != nil {
		t.Errorf("Release of a live lease: %v %v", ok, err)
	}
}

func TestRunWithLease(t *testing.T) {
	ctx := context.Background()
	admin := setup(t, "gx_job", "gx_job", 1)
	exec(t, admin, "BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO gx_job VALUES (1, 8); COMMIT")
	p := pool(t)
	err := RunWithLease(ctx, p, "gx-job", 900*time.Millisecond, pgfencing.LeaseOptions{},
		func(ctx context.Context, c *pgx.Conn, l *pgfencing.Lease) error {
			if _, err := c.Exec(ctx, "SELECT fencing_advance('gx_job', current_setting('pg_fencing.token')::bigint)"); err != nil {
				return err
			}
			if _, err := c.Exec(ctx, "UPDATE gx_job SET v = 10 WHERE id = 1"); err != nil {
				return err
			}
			exec(t, admin, "SELECT pg_terminate_backend(holder_pid) FROM fencing_leases WHERE name = 'gx-job'")
			time.Sleep(time.Second)
			return nil
		})
	if !errors.Is(err, pgfencing.ErrLeaseLost) {
		t.Errorf("RunWithLease with the lease lost mid-job: %v, want FT003", err)
	}
	if v := value(t, admin, "SELECT v FROM gx_job WHERE id = 1"); v != 8 {
		t.Errorf("its write was not committed: v = %d", v)
	}
	var got int64
	err = RunWithLease(ctx, p, "gx-job2", 5*time.Second, pgfencing.LeaseOptions{},
		func(ctx context.Context, c *pgx.Conn, l *pgfencing.Lease) error {
			return c.QueryRow(ctx, "SELECT current_setting('pg_fencing.token')::bigint").Scan(&got)
		})
	if err != nil || got < 1 {
		t.Errorf("RunWithLease runs fn with the lease's token: %d, %v", got, err)
	}
	if n := value(t, admin, "SELECT count(*) FROM fencing_leases WHERE name = 'gx-job2' AND live"); n != 0 {
		t.Errorf("and released the lease")
	}
}

func TestSwallowedErrorRollsBack(t *testing.T) {
	ctx := context.Background()
	admin := setup(t, "gx_swallow", "gx_swallow", 10)
	exec(t, admin, "BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO gx_swallow VALUES (1, 0); COMMIT")
	c := connect(t, "gx_swallow")
	err := Fenced(ctx, c, 10, func(ctx context.Context, c *pgx.Conn) error {
		if _, err := c.Exec(ctx, "UPDATE gx_swallow SET v = 1 WHERE id = 1"); err != nil {
			return err
		}
		_, _ = c.Exec(ctx, "SELECT 1/0") // an error fn goes on after
		return nil
	})
	if !errors.Is(err, pgfencing.ErrRolledBack) {
		t.Errorf("fn went on after a failed statement: %v, want ErrRolledBack", err)
	}
	if v := value(t, admin, "SELECT v FROM gx_swallow WHERE id = 1"); v != 0 || c.PgConn().TxStatus() != 'I' {
		t.Errorf("nothing committed and the connection idle: v = %d, status %c", v, c.PgConn().TxStatus())
	}
}

func TestStalledLease(t *testing.T) {
	ctx := context.Background()
	admin := setup(t, "gx_stall", "gx_stall", 1)
	exec(t, admin, "BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO gx_stall VALUES (1, 8); COMMIT")
	p := pool(t)
	l, err := AcquireLease(ctx, p, "gx-stall", 1200*time.Millisecond, pgfencing.LeaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pid := value(t, admin, "SELECT holder_pid FROM fencing_leases WHERE name = 'gx-stall'")
	time.Sleep(200 * time.Millisecond)
	must(t, syscall.Kill(int(pid), syscall.SIGSTOP))
	defer syscall.Kill(int(pid), syscall.SIGCONT)
	select {
	case <-l.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("a lease whose renewals stall cancels its Context at its TTL")
	}
	if !errors.Is(l.Check(), pgfencing.ErrLeaseLost) {
		t.Errorf("Check() after the TTL passed without a renewal: %v", l.Check())
	}
	t0 := time.Now()
	if ok, _ := l.Release(ctx); ok || time.Since(t0) > 1500*time.Millisecond {
		t.Errorf("Release does not wait for the stalled renewal: %v after %v", ok, time.Since(t0))
	}
	syscall.Kill(int(pid), syscall.SIGCONT)
	err = RunWithLease(ctx, p, "gx-stalljob", time.Second, pgfencing.LeaseOptions{},
		func(ctx context.Context, c *pgx.Conn, l *pgfencing.Lease) error {
			if _, err := c.Exec(ctx, "SELECT fencing_advance('gx_stall', $1)", l.Token()); err != nil {
				return err
			}
			if _, err := c.Exec(ctx, "UPDATE gx_stall SET v = 77 WHERE id = 1"); err != nil {
				return err
			}
			jp := value(t, admin, "SELECT holder_pid FROM fencing_leases WHERE name = 'gx-stalljob'")
			must(t, syscall.Kill(int(jp), syscall.SIGSTOP))
			time.Sleep(1500 * time.Millisecond)
			must(t, syscall.Kill(int(jp), syscall.SIGCONT))
			return nil
		})
	if !errors.Is(err, pgfencing.ErrLeaseLost) {
		t.Errorf("RunWithLease whose lease stalled past its TTL: %v, want FT003", err)
	}
	if v := value(t, admin, "SELECT v FROM gx_stall WHERE id = 1"); v != 8 {
		t.Errorf("its write was not committed: v = %d", v)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fn ends the fenced transaction itself (a ROLLBACK or COMMIT statement, or a pgx Tx begun and
// committed inside it): Fenced's COMMIT would find no transaction (a warning, no error), so it
// must not report success.
func TestFnEndsTheTransaction(t *testing.T) {
	ctx := context.Background()
	admin := setup(t, "gx_ended", "gx_ended", 10)
	exec(t, admin, "BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO gx_ended VALUES (1, 0); COMMIT")
	c := connect(t, "gx_ended")
	ends := map[string]func(context.Context, *pgx.Conn) error{
		"ROLLBACK": update("ROLLBACK"),
		"COMMIT":   update("COMMIT"),
		"conn.Begin and tx.Commit": func(ctx context.Context, c *pgx.Conn) error {
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			return tx.Commit(ctx)
		},
	}
	for _, name := range []string{"ROLLBACK", "COMMIT", "conn.Begin and tx.Commit"} {
		before := value(t, admin, "SELECT v FROM gx_ended WHERE id = 1")
		err := Fenced(ctx, c, 10, func(ctx context.Context, c *pgx.Conn) error {
			if _, err := c.Exec(ctx, "UPDATE gx_ended SET v = v + 1 WHERE id = 1"); err != nil {
				return err
			}
			return ends[name](ctx, c)
		})
		if !errors.Is(err, pgfencing.ErrEndedByFn) {
			t.Errorf("fn ran %s: %v, want an error saying it ended the fenced transaction", name, err)
		}
		if v := value(t, admin, "SELECT v FROM gx_ended WHERE id = 1"); name == "ROLLBACK" && v != before {
			t.Errorf("fn ran ROLLBACK: v = %d, want %d", v, before)
		}
		if s := c.PgConn().TxStatus(); s != 'I' {
			t.Errorf("fn ran %s: the connection is left in status %c", name, s)
		}
	}
}
