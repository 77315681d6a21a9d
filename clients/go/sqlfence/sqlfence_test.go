package sqlfence

// Against a real server with pg_fencing preloaded (tests/goclient/run.sh): PGFENCING_TEST_DSN
// (a URL) and PGFENCING_TEST_LOG (the server's log, log_statement = all, '[%a] ' prefix).

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	pgfencing "github.com/pg-fencing/pg_fencing/clients/go"

	"github.com/lib/pq"
)

func open(t *testing.T, app string, max int) *sql.DB {
	d := os.Getenv("PGFENCING_TEST_DSN")
	if d == "" {
		t.Fatal("PGFENCING_TEST_DSN is not set: run tests/goclient/run.sh")
	}
	sep := "?"
	if strings.Contains(d, "?") {
		sep = "&"
	}
	db, err := sql.Open("postgres", d+sep+"sslmode=disable&application_name="+app)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(max)
	t.Cleanup(func() { db.Close() })
	return db
}

func exec(t *testing.T, db *sql.DB, q string, args ...interface{}) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func value(t *testing.T, db *sql.DB, q string, args ...interface{}) int64 {
	t.Helper()
	var v int64
	if err := db.QueryRow(q, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v
}

func update(q string, args ...interface{}) func(context.Context, *sql.Conn) error {
	return func(ctx context.Context, c *sql.Conn) error {
		_, err := c.ExecContext(ctx, q, args...)
		return err
	}
}

func TestFenced(t *testing.T) {
	ctx := context.Background()
	admin := open(t, "admin", 2)
	exec(t, admin, "CREATE TABLE sq_acct (id int PRIMARY KEY, v int)")
	exec(t, admin, "SELECT fencing_protect('sq_acct', 'sq')")
	exec(t, admin, "SELECT fencing_advance('sq', 10)")
	db := open(t, "sq_client", 1)
	if err := Fenced(ctx, db, 10, update("INSERT INTO sq_acct VALUES (1, 1)")); err != nil {
		t.Fatalf("a fenced transaction: %v", err)
	}
	if v := value(t, admin, "SELECT fence_token FROM sq_acct WHERE id = 1"); v != 10 {
		t.Errorf("the row's token is %d", v)
	}
	err := Fenced(ctx, db, 9, update("UPDATE sq_acct SET v = $1 WHERE id = $2", 2, 1))
	var fe *pgfencing.Error
	if !errors.As(err, &fe) || !errors.Is(err, pgfencing.ErrStaleToken) || fe.Token != 9 || fe.HighWater != 10 || fe.Resource != "sq" {
		t.Fatalf("a stale token: %v (%+v)", err, fe)
	}
	var pe *pq.Error
	if !errors.As(err, &pe) {
		t.Errorf("lib/pq's error is unwrapped from it")
	}
	// The pool's one connection: the next borrower carries no token.
	_, err = db.Exec("UPDATE sq_acct SET v = 3 WHERE id = 1")
	if !errors.Is(FromError(err), pgfencing.ErrNoToken) {
		t.Errorf("the next borrower's write without a token is refused (FT002): %v", err)
	}
	mine := errors.New("the handler failed")
	if err := Fenced(ctx, db, 10, func(ctx context.Context, c *sql.Conn) error {
		_, _ = c.ExecContext(ctx, "UPDATE sq_acct SET v = 4 WHERE id = 1")
		return mine
	}); err != mine {
		t.Errorf("fn's error unchanged: %v", err)
	}
	if v := value(t, admin, "SELECT v FROM sq_acct WHERE id = 1"); v != 1 {
		t.Errorf("refused and failed transactions left v = %d", v)
	}
	if s := db.Stats(); s.OpenConnections != 1 {
		t.Errorf("the pool kept its one connection: %d", s.OpenConnections)
	}
}

func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	admin := open(t, "admin", 1)
	exec(t, admin, "CREATE TABLE sq_rt (id int PRIMARY KEY, v int)")
	exec(t, admin, "SELECT fencing_protect('sq_rt', 'sq_rt')")
	exec(t, admin, "SELECT fencing_advance('sq_rt', 10)")
	exec(t, admin, "CREATE TABLE sq_plain (id int PRIMARY KEY, v int)")
	exec(t, admin, "INSERT INTO sq_plain VALUES (1, 0)")
	f, u := open(t, "sq_rt_fenced", 1), open(t, "sq_rt_plain", 1)
	if err := Fenced(ctx, f, 10, update("INSERT INTO sq_rt VALUES ($1, 0)", 1)); err != nil {
		t.Fatal(err)
	}
	tx, err := u.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE sq_plain SET v = v + 1 WHERE id = $1", 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	b, err := os.ReadFile(os.Getenv("PGFENCING_TEST_LOG"))
	if err != nil {
		t.Fatal(err)
	}
	count := func(app string) (n int) {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "["+app+"]") && (strings.Contains(l, "LOG:  statement:") || strings.Contains(l, "LOG:  execute")) {
				n++
			}
		}
		return
	}
	if nf, nu := count("sq_rt_fenced"), count("sq_rt_plain"); nf != nu || nf == 0 {
		t.Errorf("a fenced transaction sends as many statements as db.BeginTx/Commit: %d and %d", nf, nu)
	}
}

func TestRunWithLease(t *testing.T) {
	ctx := context.Background()
	admin := open(t, "admin", 2)
	exec(t, admin, "CREATE TABLE sq_job (id int PRIMARY KEY, v int)")
	exec(t, admin, "SELECT fencing_protect('sq_job', 'sq_job')")
	db := open(t, "sq_job", 3)
	var token int64
	err := RunWithLease(ctx, db, "sq-job", 5*time.Second, pgfencing.LeaseOptions{},
		func(ctx context.Context, c *sql.Conn, l *pgfencing.Lease) error {
			token = l.Token()
			if _, err := c.ExecContext(ctx, "SELECT fencing_advance('sq_job', $1)", l.Token()); err != nil {
				return err
			}
			_, err := c.ExecContext(ctx, "INSERT INTO sq_job VALUES (1, 8)")
			return err
		})
	if err != nil || value(t, admin, "SELECT fence_token FROM sq_job WHERE id = 1") != token {
		t.Fatalf("RunWithLease commits with the lease's token: %v", err)
	}
	err = RunWithLease(ctx, db, "sq-job", 900*time.Millisecond, pgfencing.LeaseOptions{},
		func(ctx context.Context, c *sql.Conn, l *pgfencing.Lease) error {
			if l.Token() <= token {
				t.Errorf("a later grant of the same lease has a higher token: %d after %d", l.Token(), token)
			}
			if _, err := c.ExecContext(ctx, "UPDATE sq_job SET v = 10 WHERE id = 1"); err != nil {
				return err
			}
			exec(t, admin, "SELECT pg_terminate_backend(holder_pid) FROM fencing_leases WHERE name = 'sq-job'")
			time.Sleep(time.Second)
			return nil
		})
	if !errors.Is(err, pgfencing.ErrLeaseLost) {
		t.Errorf("a lease lost mid-job: %v, want FT003", err)
	}
	if v := value(t, admin, "SELECT v FROM sq_job WHERE id = 1"); v != 8 {
		t.Errorf("its write was not committed: v = %d", v)
	}
}

func TestSwallowedErrorRollsBack(t *testing.T) {
	ctx := context.Background()
	admin := open(t, "admin", 2)
	exec(t, admin, "CREATE TABLE sq_swallow (id int PRIMARY KEY, v int)")
	exec(t, admin, "SELECT fencing_protect('sq_swallow', 'sq_swallow')")
	exec(t, admin, "SELECT fencing_advance('sq_swallow', 10)")
	db := open(t, "sq_swallow", 1)
	if err := Fenced(ctx, db, 10, update("INSERT INTO sq_swallow VALUES (1, 0)")); err != nil {
		t.Fatal(err)
	}
	err := Fenced(ctx, db, 10, func(ctx context.Context, c *sql.Conn) error {
		if _, err := c.ExecContext(ctx, "UPDATE sq_swallow SET v = 1 WHERE id = 1"); err != nil {
			return err
		}
		_, _ = c.ExecContext(ctx, "SELECT 1/0") // an error fn goes on after
		return nil
	})
	if !errors.Is(err, pgfencing.ErrRolledBack) {
		t.Errorf("fn went on after a failed statement: %v, want ErrRolledBack", err)
	}
	if v := value(t, admin, "SELECT v FROM sq_swallow WHERE id = 1"); v != 0 {
		t.Errorf("nothing committed: v = %d", v)
	}
	_, err = db.Exec("UPDATE sq_swallow SET v = 2 WHERE id = 1")
	if !errors.Is(FromError(err), pgfencing.ErrNoToken) {
		t.Errorf("the pool's connection afterwards: idle, no token (FT002): %v", err)
	}
}

// lib/pq does not give up on a blocked read when its context is cancelled: a renewal stuck on a
// stalled connection must not keep the lease (and RunWithLease's commit) alive.
func TestStalledLease(t *testing.T) {
	ctx := context.Background()
	admin := open(t, "admin", 2)
	exec(t, admin, "CREATE TABLE sq_stall (id int PRIMARY KEY, v int)")
	exec(t, admin, "SELECT fencing_protect('sq_stall', 'sq_stall')")
	db := open(t, "sq_stall", 3)
	err := RunWithLease(ctx, db, "sq-stalljob", time.Second, pgfencing.LeaseOptions{},
		func(ctx context.Context, c *sql.Conn, l *pgfencing.Lease) error {
			if _, err := c.ExecContext(ctx, "SELECT fencing_advance('sq_stall', $1)", l.Token()); err != nil {
				return err
			}
			if _, err := c.ExecContext(ctx, "INSERT INTO sq_stall VALUES (1, 77)"); err != nil {
				return err
			}
			pid := value(t, admin, "SELECT holder_pid FROM fencing_leases WHERE name = 'sq-stalljob'")
			if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond)
			syscall.Kill(int(pid), syscall.SIGCONT)
			return nil
		})
	if !errors.Is(err, pgfencing.ErrLeaseLost) {
		t.Errorf("RunWithLease whose lease stalled past its TTL: %v, want FT003", err)
	}
	if n := value(t, admin, "SELECT count(*) FROM sq_stall"); n != 0 {
		t.Errorf("its write was not committed: %d rows", n)
	}
}

// fn ends the fenced transaction itself (a ROLLBACK or COMMIT statement on its *sql.Conn;
// conn.BeginTx is refused by lib/pq there): Fenced's COMMIT would find no transaction (a
// warning, no error), so it must not report success.
func TestFnEndsTheTransaction(t *testing.T) {
	ctx := context.Background()
	admin := open(t, "admin", 2)
	exec(t, admin, "CREATE TABLE sq_ended (id int PRIMARY KEY, v int)")
	exec(t, admin, "SELECT fencing_protect('sq_ended', 'sq_ended')")
	exec(t, admin, "SELECT fencing_advance('sq_ended', 10)")
	db := open(t, "sq_ended", 1)
	if err := Fenced(ctx, db, 10, update("INSERT INTO sq_ended VALUES (1, 0)")); err != nil {
		t.Fatal(err)
	}
	for _, end := range []string{"ROLLBACK", "COMMIT"} {
		before := value(t, admin, "SELECT v FROM sq_ended WHERE id = 1")
		err := Fenced(ctx, db, 10, func(ctx context.Context, c *sql.Conn) error {
			if _, err := c.ExecContext(ctx, "UPDATE sq_ended SET v = v + 1 WHERE id = 1"); err != nil {
				return err
			}
			_, err := c.ExecContext(ctx, end)
			return err
		})
		if !errors.Is(err, pgfencing.ErrEndedByFn) || errors.Is(err, pgfencing.ErrRolledBack) {
			t.Errorf("fn ran %s: %v, want an error saying it ended the fenced transaction", end, err)
		}
		if v := value(t, admin, "SELECT v FROM sq_ended WHERE id = 1"); end == "ROLLBACK" && v != before {
			t.Errorf("fn ran ROLLBACK: v = %d, want %d", v, before)
		}
		_, err = db.Exec("UPDATE sq_ended SET v = 100 WHERE id = 1")
		if !errors.Is(FromError(err), pgfencing.ErrNoToken) {
			t.Errorf("fn ran %s: the pool's connection afterwards: idle, no token (FT002): %v", end, err)
		}
	}
	if s := db.Stats(); s.OpenConnections != 1 {
		t.Errorf("the pool kept its one connection: %d", s.OpenConnections)
	}
}
