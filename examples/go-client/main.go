// A service's side of pg_fencing in Go, with etcd as the lock service: the same program as
// examples/rust-client, flag for flag, so tests/client/run.sh drives both.
//
//  1. concurrency.NewSession grants an etcd lease and keeps it alive.
//  2. concurrency.NewMutex(...).Lock takes the etcd lock under that lease. The fencing token is
//     the revision in the lock response's header, m.Header().Revision: the revision at which the
//     lock was granted (the same number as `etcdctl lock`'s ETCD_LOCK_REV and as the Rust
//     example's; not the lock key's create revision, which orders differently when holders queue).
//  3. Writes to PostgreSQL through pgx with that token, one transaction per write, in one of two
//     styles: sql (set_config('pg_fencing.token', $1, true), then plain SQL) or function
//     (fenced_update / fenced_insert, the token as an argument).
//  4. If PostgreSQL refuses a write as fenced off (FT001, FT003, FT006), it stops at once: a newer
//     holder has (or may have) the lock. It never retries with the same token.
//
// It writes to a table ledger (account int PRIMARY KEY, balance bigint) protected with
// SELECT fencing_protect('ledger', 'settlement'); each write adds --amount to the account's
// balance (inserting the row if it is missing).
//
// Output: token=<n> once the lock is held, then `wrote account=<a> balance=<b> token=<n>` per
// committed write (stdout); errors on stderr. Exit status: 0 done (lock released, lease revoked),
// 1 any other error, 2 bad arguments, 3 fenced off.
//
// Built with Debian 12's Go 1.19 and packages, in GOPATH mode (tests/client/run.sh --client go):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o pg-fencing-client-go examples/go-client/main.go
//
// etcd 3.4's client lives at go.etcd.io/etcd/clientv3 (3.5 moved it to go.etcd.io/etcd/client/v3;
// docs/clients.md shows both).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

const (
	exitFailed    = 1
	exitUsage     = 2
	exitFencedOff = 3
)

type args struct {
	etcd     []string
	pg       string
	lock     string
	ttl      int
	account  int32
	amount   int64
	writes   int
	interval time.Duration
	style    string
}

// errFencedOff wraps a refusal that means a newer lock holder exists.
var errFencedOff = errors.New("fenced off")

// classify says what a PostgreSQL error means for the holder: "fenced off" (stop, never retry
// with this token), "retry" (serialization failure or deadlock: the same token may try again),
// or "failed".
func classify(code string) string {
	switch code {
	case "FT001", "FT003", "FT006":
		return "fenced off"
	case "40001", "40P01":
		return "retry"
	}
	return "failed"
}

func parseArgs(argv []string) (args, error) {
	fs := flag.NewFlagSet("pg-fencing-client-go", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	etcd := fs.String("etcd", "127.0.0.1:2379", "etcd endpoints, comma-separated")
	pg := fs.String("pg", "host=127.0.0.1 user=postgres dbname=postgres", "libpq-style connection string")
	lock := fs.String("lock", "settlement", "etcd lock name")
	ttl := fs.Int("ttl", 10, "lease TTL in seconds")
	account := fs.Int("account", 1, "ledger row to write")
	amount := fs.Int64("amount", 1, "added to the balance by each write")
	writes := fs.Int("writes", 1, "number of writes, one transaction each")
	intervalMs := fs.Int("interval-ms", 1000, "pause between writes")
	style := fs.String("style", "sql", "sql | function")
	if err := fs.Parse(argv); err != nil {
		return args{}, err
	}
	if fs.NArg() > 0 {
		return args{}, fmt.Errorf("unknown argument %q", fs.Arg(0))
	}
	if *ttl < 1 {
		return args{}, errors.New("--ttl must be at least 1")
	}
	if *style != "sql" && *style != "function" {
		return args{}, fmt.Errorf("--style must be sql or function, not %q", *style)
	}
	return args{strings.Split(*etcd, ","), *pg, *lock, *ttl, int32(*account), *amount, *writes,
		time.Duration(*intervalMs) * time.Millisecond, *style}, nil
}

func main() {
	a, err := parseArgs(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(exitUsage)
	}
	if err := run(a); err != nil {
		if errors.Is(err, errFencedOff) {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(exitFencedOff)
		}
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(exitFailed)
	}
}

func run(a args) error {
	ctx := context.Background()
	db, err := pgx.Connect(ctx, a.pg)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer db.Close(ctx)

	cli, err := clientv3.New(clientv3.Config{Endpoints: a.etcd, DialTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer cli.Close()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(a.ttl)) // lease + keep-alive
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer s.Close() // revokes the lease: releases the lock if we still hold it
	// s.Done() is closed when the lease is gone: say so, unless we are closing the session.
	closing := make(chan struct{})
	defer close(closing) // runs before s.Close()
	go func() {
		select {
		case <-s.Done():
			select {
			case <-closing:
			default:
				fmt.Fprintf(os.Stderr, "lease %x lost (expired or not refreshed)\n", int64(s.Lease()))
			}
		case <-closing:
		}
	}()

	m := concurrency.NewMutex(s, a.lock)
	if err := m.Lock(ctx); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	token := m.Header().Revision // == ETCD_LOCK_REV
	fmt.Printf("token=%d\n", token)

	for i := 0; i < a.writes; i++ {
		if i > 0 {
			time.Sleep(a.interval)
		}
		balance, err := write(ctx, db, a, token)
		if err != nil {
			return err
		}
		fmt.Printf("wrote account=%d balance=%d token=%d\n", a.account, balance, token)
	}
	unlockCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return m.Unlock(unlockCtx)
}

// write runs one write, retrying a serialization failure or deadlock twice with the same token;
// a refusal as fenced off comes back wrapped in errFencedOff.
func write(ctx context.Context, db *pgx.Conn, a args, token int64) (int64, error) {
	const attempts = 3
	for attempt := 1; ; attempt++ {
		var balance int64
		var err error
		if a.style == "sql" {
			balance, err = writeSQL(ctx, db, a, token)
		} else {
			balance, err = writeFunction(ctx, db, a, token)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			what := fmt.Sprintf("SQLSTATE %s: %s", pgErr.Code, pgErr.Message)
			if pgErr.Detail != "" {
				what += " (" + pgErr.Detail + ")"
			}
			switch v := classify(pgErr.Code); {
			case v == "fenced off":
				return 0, fmt.Errorf("%w: %s", errFencedOff, what)
			case attempt < attempts && (v == "retry" || (a.style == "function" && pgErr.Code == "23505")):
				fmt.Fprintf(os.Stderr, "retrying after %s (attempt %d of %d, same token)\n", what, attempt, attempts)
				time.Sleep(time.Duration(50*attempt) * time.Millisecond)
				continue
			default:
				return 0, errors.New(what)
			}
		}
		return balance, err
	}
}

// Style sql: the token for this transaction only (set_config(..., true), one statement for
// pg_stat_statements whatever the token), then plain SQL. The token is sent as text: pgx does not
// encode an int64 into a text parameter.
func writeSQL(ctx context.Context, db *pgx.Conn, a args, token int64) (int64, error) {
	var balance int64
	err := db.BeginFunc(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('pg_fencing.token', $1, true)",
			strconv.FormatInt(token, 10)); err != nil {
			return err
		}
		return tx.QueryRow(ctx,
			"INSERT INTO ledger (account, balance) VALUES ($1, $2) "+
				"ON CONFLICT (account) DO UPDATE SET balance = ledger.balance + EXCLUDED.balance "+
				"RETURNING balance", a.account, a.amount).Scan(&balance)
	})
	return balance, err
}

// Style function: fenced_update / fenced_insert take the token as an argument and leave the
// session's pg_fencing.token alone. They set whole values, so read the row first (a plain read,
// not FOR UPDATE: see examples/rust-client/src/main.rs for why).
func writeFunction(ctx context.Context, db *pgx.Conn, a args, token int64) (int64, error) {
	var balance int64
	err := db.BeginFunc(ctx, func(tx pgx.Tx) error {
		var current *int64
		err := tx.QueryRow(ctx, "SELECT balance FROM ledger WHERE account = $1", a.account).Scan(&current)
		found := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		sql := "SELECT (fenced_insert('ledger', jsonb_build_object('account', $1::int, " +
			"'balance', $2::bigint), $3) ->> 'balance')::bigint"
		if found {
			sql = "SELECT (fenced_update('ledger', jsonb_build_object('account', $1::int), " +
				"jsonb_build_object('balance', $2::bigint), $3) ->> 'balance')::bigint"
		}
		next := a.amount
		if current != nil {
			next += *current
		}
		return tx.QueryRow(ctx, sql, a.account, next, token).Scan(&balance)
	})
	return balance, err
}
