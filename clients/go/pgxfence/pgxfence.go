// Package pgxfence: pg_fencing with pgx v4 (a *pgx.Conn, or a *pgxpool.Pool). The pgx-specific
// part is small (the error type and the connection types): pgx v5 needs the import paths changed
// and pgconn.PgError taken from github.com/jackc/pgx/v5/pgconn.
package pgxfence

import (
	"context"
	"errors"
	"time"

	pgfencing "github.com/pg-fencing/pg_fencing/clients/go"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// FromError is the *pgfencing.Error for an error whose SQLSTATE is of class FT (err itself if it
// already is one), nil otherwise.
func FromError(err error) *pgfencing.Error {
	var fe *pgfencing.Error
	if errors.As(err, &fe) {
		return fe
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pgfencing.IsFencing(pe.Code) {
		return pgfencing.NewError(pe.Code, pe.Message, pe.Detail, pe.Hint, err)
	}
	return nil
}

func typed(err error) error {
	if fe := FromError(err); fe != nil {
		return fe
	}
	return err
}

// Fenced runs fn on conn in a transaction fenced by token: BEGIN and the token in one query
// (no extra round trip), committed when fn returns nil, rolled back when it returns an error or
// panics. An FT SQLSTATE comes back as a *pgfencing.Error (errors.Is with the sentinels); fn's
// own error unchanged. pgfencing.ErrRolledBack if a statement failed and fn went on; an error
// ("… ended the fenced transaction …") if fn sent COMMIT or ROLLBACK itself, never nil. conn must
// not be in a transaction.
func Fenced(ctx context.Context, conn *pgx.Conn, token int64, fn func(ctx context.Context, conn *pgx.Conn) error) (err error) {
	begin, err := pgfencing.BeginSQL(token)
	if err != nil {
		return err
	}
	if s := conn.PgConn().TxStatus(); s != 'I' {
		return errors.New("pgxfence: Fenced starts its own transaction: the connection is in one")
	}
	if _, err := conn.Exec(ctx, begin); err != nil { // no arguments: the simple protocol
		rollback(conn)
		return typed(err)
	}
	done := false
	defer func() {
		if !done {
			rollback(conn)
		}
	}()
	if err := fn(ctx, conn); err != nil {
		return typed(err)
	}
	if conn.PgConn().TxStatus() == 'E' { // fn went on after a failed statement
		return pgfencing.ErrRolledBack // (the deferred rollback ends it)
	}
	if conn.PgConn().TxStatus() == 'I' { // fn sent COMMIT or ROLLBACK: COMMIT would only warn
		return pgfencing.ErrEndedByFn
	}
	done = true
	tag, err := conn.Exec(ctx, "COMMIT")
	if err != nil {
		rollback(conn)
		return typed(err)
	}
	if tag.String() == "ROLLBACK" { // PostgreSQL's answer to COMMIT of an aborted transaction
		return pgfencing.ErrRolledBack
	}
	return nil
}

// rollback ends a transaction left open (not under the caller's context, which may be done).
func rollback(conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Close(ctx) // unusable: a pool destroys a closed connection
	}
}

// FencedPool is Fenced on a connection taken from pool for the transaction and given back (a
// connection left in a transaction or broken is destroyed by the pool, never lent again).
func FencedPool(ctx context.Context, pool *pgxpool.Pool, token int64, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	if _, err := pgfencing.BeginSQL(token); err != nil {
		return err
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return Fenced(ctx, c.Conn(), token, fn)
}

// LeaseConn is a pgfencing.LeaseConn on a connection of its own.
type LeaseConn struct{ Conn *pgx.Conn }

// Acquire runs fencing_lease_acquire(name, ttl, wait).
func (c LeaseConn) Acquire(ctx context.Context, name string, ttl, wait time.Duration) (int64, error) {
	var token int64
	err := c.Conn.QueryRow(ctx, "SELECT fencing_lease_acquire($1, make_interval(secs => $2), make_interval(secs => $3))",
		name, ttl.Seconds(), wait.Seconds()).Scan(&token)
	return token, typed(err)
}

// Renew runs fencing_lease_renew(token, ttl).
func (c LeaseConn) Renew(ctx context.Context, token int64, ttl time.Duration) error {
	_, err := c.Conn.Exec(ctx, "SELECT fencing_lease_renew($1, make_interval(secs => $2))", token, ttl.Seconds())
	return typed(err)
}

// Release runs fencing_lease_release(token).
func (c LeaseConn) Release(ctx context.Context, token int64) (bool, error) {
	var released bool
	err := c.Conn.QueryRow(ctx, "SELECT fencing_lease_release($1)", token).Scan(&released)
	return released, typed(err)
}

// Remaining asks how long the lease holding token still has.
func (c LeaseConn) Remaining(ctx context.Context, token int64) (time.Duration, error) {
	var s float64
	err := c.Conn.QueryRow(ctx, "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 FROM fencing_leases WHERE token = $1", token).Scan(&s)
	return time.Duration(s * float64(time.Second)), typed(err)
}

// Close closes the connection.
func (c LeaseConn) Close() error { return c.Conn.Close(context.Background()) }

// AcquireLease takes PostgreSQL lease name on a new connection made from pool's configuration.
func AcquireLease(ctx context.Context, pool *pgxpool.Pool, name string, ttl time.Duration, opt pgfencing.LeaseOptions) (*pgfencing.Lease, error) {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, err
	}
	return pgfencing.AcquireLease(ctx, LeaseConn{conn}, name, ttl, opt)
}

// RunWithLease takes lease name, runs fn in a transaction on pool fenced by its token while the
// lease is renewed (fn's ctx is the lease's Context: cancelled if the lease is lost), checks the
// lease before committing, and releases it. A lost lease: an *pgfencing.Error with code FT003,
// nothing committed.
func RunWithLease(ctx context.Context, pool *pgxpool.Pool, name string, ttl time.Duration, opt pgfencing.LeaseOptions,
	fn func(ctx context.Context, conn *pgx.Conn, lease *pgfencing.Lease) error) error {
	lease, err := AcquireLease(ctx, pool, name, ttl, opt)
	if err != nil {
		return err
	}
	defer lease.Release(context.Background())
	err = FencedPool(lease.Context(), pool, lease.Token(), func(ctx context.Context, conn *pgx.Conn) error {
		if err := fn(ctx, conn, lease); err != nil {
			return err
		}
		return lease.Check()
	})
	if err != nil && lease.Err() != nil {
		return lease.Err() // the lease was lost: that is why fn's statements were cancelled
	}
	return err
}
