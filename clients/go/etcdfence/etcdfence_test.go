package etcdfence

// Against a real etcd (PGFENCING_TEST_ETCD: host:port) and PostgreSQL with pg_fencing
// (PGFENCING_TEST_DSN), as tests/goclient/run.sh starts them.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	pgfencing "github.com/pg-fencing/pg_fencing/clients/go"
	"github.com/pg-fencing/pg_fencing/clients/go/pgxfence"

	"github.com/jackc/pgx/v4"
	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

func clients(t *testing.T) (*clientv3.Client, *pgx.Conn) {
	ep, dsn := os.Getenv("PGFENCING_TEST_ETCD"), os.Getenv("PGFENCING_TEST_DSN")
	if ep == "" || dsn == "" {
		t.Fatal("PGFENCING_TEST_ETCD or PGFENCING_TEST_DSN is not set: run tests/goclient/run.sh")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return cli, c
}

func TestRunWithLockFencesTheOlderHolder(t *testing.T) {
	ctx := context.Background()
	cli, c := clients(t)
	if _, err := c.Exec(ctx, "CREATE TABLE ed_acct (id int PRIMARY KEY, v int); SELECT fencing_protect('ed_acct', 'ed')"); err != nil {
		t.Fatal(err)
	}
	var first int64
	err := RunWithLock(ctx, cli, "ed-lock", 5, func(ctx context.Context, token int64) error {
		first = token
		return pgxfence.Fenced(ctx, c, token, func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "INSERT INTO ed_acct VALUES (1, 1)")
			return err
		})
	})
	if err != nil || first < 1 {
		t.Fatalf("the first holder writes with its token %d: %v", first, err)
	}
	var second int64
	err = RunWithLock(ctx, cli, "ed-lock", 5, func(ctx context.Context, token int64) error {
		second = token
		return pgxfence.Fenced(ctx, c, token, func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "UPDATE ed_acct SET v = 2 WHERE id = 1")
			return err
		})
	})
	if err != nil || second <= first {
		t.Fatalf("the next holder's token is higher (%d after %d): %v", second, first, err)
	}
	// The first holder, paused past its lease, writes again with its old token.
	err = pgxfence.Fenced(ctx, c, first, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "UPDATE ed_acct SET v = 3 WHERE id = 1")
		return err
	})
	var fe *pgfencing.Error
	if !errors.As(err, &fe) || fe.Code != pgfencing.CodeStaleToken || fe.Token != first || fe.HighWater != second {
		t.Errorf("the zombie's write is refused FT001 with its token and the mark: %v", err)
	}
}

func TestLockWhoseLeaseIsRevokedWhileWaiting(t *testing.T) {
	ctx := context.Background()
	cli, _ := clients(t)
	holder, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	hm, _, err := Lock(ctx, holder, "ed-wait")
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		token int64
		err   error
	}
	out := make(chan result, 1)
	go func() {
		_, tok, err := Lock(ctx, waiter, "ed-wait")
		out <- result{tok, err}
	}()
	time.Sleep(500 * time.Millisecond) // queued behind the holder
	if _, err := cli.Revoke(ctx, waiter.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := hm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-out:
		if !errors.Is(r.err, pgfencing.ErrLeaseLost) || r.token != 0 {
			t.Errorf("a lock whose key was deleted while it waited is not granted (FT003, no token): %d %v", r.token, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lock did not return after the holder let go")
	}
}

// B queues behind A; B's key is deleted; C queues; B's key is created again under B's lease (a
// second Lock on B's session); A unlocks. C owns the lock (its key is the oldest): B's first Lock
// must not be granted, or two holders would carry tokens of the same order.
func TestLockWhoseKeyIsCreatedAgainWhileWaiting(t *testing.T) {
	ctx := context.Background()
	cli, _ := clients(t)
	session := func() *concurrency.Session {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b, c := session(), session(), session()
	am, _, err := Lock(ctx, a, "ed-again")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		token int64
		err   error
	}
	lock := func(s *concurrency.Session) chan result {
		out := make(chan result, 1)
		go func() {
			_, tok, err := Lock(ctx, s, "ed-again")
			out <- result{tok, err}
		}()
		time.Sleep(300 * time.Millisecond)
		return out
	}
	b1 := lock(b)
	if r, err := cli.Delete(ctx, fmt.Sprintf("ed-again/%x", b.Lease())); err != nil || r.Deleted != 1 {
		t.Fatalf("deleting B's key: %v %v", r, err)
	}
	c1 := lock(c)
	lock(b) // B's key again, younger than C's
	if err := am.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]chan result{"C": c1, "B's first": b1} {
		select {
		case r := <-ch:
			if name == "C" && r.err != nil {
				t.Errorf("C owns the lock: %v", r.err)
			}
			if name != "C" && (!errors.Is(r.err, pgfencing.ErrLeaseLost) || r.token != 0) {
				t.Errorf("B's first Lock is not granted (FT003, no token): %d %v", r.token, r.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s's Lock did not return", name)
		}
	}
}

func TestTokenOfAnUnlockedMutex(t *testing.T) {
	cli, _ := clients(t)
	s, err := concurrency.NewSession(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := Token(concurrency.NewMutex(s, "ed-none")); err == nil {
		t.Errorf("an unlocked mutex has no token")
	}
}
