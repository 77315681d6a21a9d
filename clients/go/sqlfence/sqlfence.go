// Package sqlfence: pg_fencing with database/sql (lib/pq; the pgx stdlib driver works the same).
// database/sql's own transactions (db.BeginTx) send BEGIN by themselves, so a fenced transaction
// runs on a *sql.Conn taken from the pool: BEGIN and the token in one query on it, then fn, then
// COMMIT, as many round trips as db.BeginTx, the statement and Commit.
package sqlfence

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"

	pgfencing "github.com/pg-fencing/pg_fencing/clients/go"

	"github.com/lib/pq"
)

// FromError is the *pgfencing.Error for an error whose SQLSTATE is of class FT (err itself if it
// already is one), nil otherwise: lib/pq's *pq.Error.
func FromError(err error) *pgfencing.Error {
	var fe *pgfencing.Error
	if errors.As(err, &fe) {
		return fe
	}
	var pe *pq.Error
	if errors.As(err, &pe) && pgfencing.IsFencing(string(pe.Code)) {
		return pgfencing.NewError(string(pe.Code), pe.Message, pe.Detail, pe.Hint, err)
	}
	return nil
}

func typed(err error) error {
	if fe := FromError(err); fe != nil {
		return fe
	}
	return err
}

// Fenced runs fn in a transaction fenced by token on a connection taken from db and given back:
// committed when fn returns nil, rolled back when it returns an error or panics (a connection
// whose ROLLBACK failed is discarded, never lent again). An FT SQLSTATE comes back as a
// *pgfencing.Error; fn's own error unchanged. pgfencing.ErrRolledBack if a statement failed and
// fn went on; an error ("… ended the fenced transaction …") if fn sent COMMIT or ROLLBACK itself,
// never nil. fn must use conn, not db.
func Fenced(ctx context.Context, db *sql.DB, token int64, fn func(ctx context.Context, conn *sql.Conn) error) (err error) {
	begin, err := pgfencing.BeginSQL(token)
	if err != nil {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	var broken bool
	defer func() {
		if broken {
			// database/sql discards a connection whose driver call returned driver.ErrBadConn.
			_ = conn.Raw(func(interface{}) error { return driver.ErrBadConn })
		}
		conn.Close()
	}()
	// No arguments: lib/pq sends it as one simple query.
	if _, err := conn.ExecContext(ctx, begin); err != nil {
		broken = !rollback(conn)
		return typed(err)
	}
	done := false
	defer func() {
		if !done {
			broken = !rollback(conn)
		}
	}()
	if err := fn(ctx, conn); err != nil {
		return typed(err)
	}
	done = true
	// lib/pq does not tell the transaction's state, and PostgreSQL answers COMMIT of an aborted
	// transaction with ROLLBACK, and one with no transaction (fn sent COMMIT or ROLLBACK itself)
	// with a warning, both without an error: the SAVEPOINT before it, in the same simple query,
	// fails instead: 25P02 when a statement failed and fn went on after its error, 25P01 when
	// there is no transaction block any more.
	if _, err := conn.ExecContext(ctx, "SAVEPOINT pg_fencing_commit; COMMIT"); err != nil {
		var pe *pq.Error
		isPq := errors.As(err, &pe)
		broken = !rollback(conn)
		if isPq && pe.Code == "25P02" {
			return pgfencing.ErrRolledBack
		}
		if isPq && pe.Code == "25P01" {
			return pgfencing.ErrEndedByFn
		}
		return typed(err)
	}
	return nil
}

// rollback ends a transaction left open; false if the connection could not be cleaned.
func rollback(conn *sql.Conn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := conn.ExecContext(ctx, "ROLLBACK")
	return err == nil
}

// LeaseConn is a pgfencing.LeaseConn on a *sql.Conn of its own.
type LeaseConn struct{ Conn *sql.Conn }

// Acquire runs fencing_lease_acquire(name, ttl, wait).
func (c LeaseConn) Acquire(ctx context.Context, name string, ttl, wait time.Duration) (int64, error) {
	var token int64
	err := c.Conn.QueryRowContext(ctx, "SELECT fencing_lease_acquire($1, make_interval(secs => $2), make_interval(secs => $3))",
		name, ttl.Seconds(), wait.Seconds()).Scan(&token)
	return token, typed(err)
}

// Renew runs fencing_lease_renew(token, ttl).
func (c LeaseConn) Renew(ctx context.Context, token int64, ttl time.Duration) error {
	_, err := c.Conn.ExecContext(ctx, "SELECT fencing_lease_renew($1, make_interval(secs => $2))", token, ttl.Seconds())
	return typed(err)
}

// Release runs fencing_lease_release(token).
func (c LeaseConn) Release(ctx context.Context, token int64) (bool, error) {
	var released bool
	err := c.Conn.QueryRowContext(ctx, "SELECT fencing_lease_release($1)", token).Scan(&released)
	return released, typed(err)
}

// Remaining asks how long the lease holding token still has.
func (c LeaseConn) Remaining(ctx context.Context, token int64) (time.Duration, error) {
	var s float64
	err := c.Conn.QueryRowContext(ctx, "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 FROM fencing_leases WHERE token = $1", token).Scan(&s)
	return time.Duration(s * float64(time.Second)), typed(err)
}

// Close gives the connection back to its pool.
func (c LeaseConn) Close() error { return c.Conn.Close() }

// AcquireLease takes PostgreSQL lease name on a connection of its own taken from db.
func AcquireLease(ctx context.Context, db *sql.DB, name string, ttl time.Duration, opt pgfencing.LeaseOptions) (*pgfencing.Lease, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return pgfencing.AcquireLease(ctx, LeaseConn{conn}, name, ttl, opt)
}

// RunWithLease takes lease name, runs fn in a transaction fenced by its token while the lease is
// renewed (fn's ctx is the lease's Context), checks the lease before committing and releases it.
// A lost lease: an *pgfencing.Error with code FT003, nothing committed.
func RunWithLease(ctx context.Context, db *sql.DB, name string, ttl time.Duration, opt pgfencing.LeaseOptions,
	fn func(ctx context.Context, conn *sql.Conn, lease *pgfencing.Lease) error) error {
	lease, err := AcquireLease(ctx, db, name, ttl, opt)
	if err != nil {
		return err
	}
	defer lease.Release(context.Background())
	err = Fenced(lease.Context(), db, lease.Token(), func(ctx context.Context, conn *sql.Conn) error {
		if err := fn(ctx, conn, lease); err != nil {
			return err
		}
		return lease.Check()
	})
	if err != nil && lease.Err() != nil {
		return lease.Err()
	}
	return err
}
