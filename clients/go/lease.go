package pgfencing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// LeaseConn is a connection of its own for one PostgreSQL lease, as the drivers' packages give
// it (sqlfence.LeaseConn, pgxfence.LeaseConn): fencing_lease_acquire / _renew / _release on it.
type LeaseConn interface {
	Acquire(ctx context.Context, name string, ttl, wait time.Duration) (int64, error)
	Renew(ctx context.Context, token int64, ttl time.Duration) error
	Release(ctx context.Context, token int64) (bool, error)
	Close() error
}

// Lease is a PostgreSQL lease (fencing_lease_acquire) renewed every RenewEvery (a third of the
// TTL unless set) by a goroutine on its own connection until Release. Its Context is cancelled
// when a renewal fails (the lease ended, or its connection broke and it may have); Err then says
// why, as an *Error with code FT003.
type Lease struct {
	Name  string
	TTL   time.Duration
	token int64

	conn   LeaseConn
	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	done   chan struct{}

	mu       sync.Mutex
	err      error
	released sync.Once
}

// LeaseOptions: Wait is how long fencing_lease_acquire may wait for the current holder (0: not
// at all, 55P03 if held); RenewEvery defaults to TTL/3.
type LeaseOptions struct {
	Wait       time.Duration
	RenewEvery time.Duration
}

// AcquireLease takes lease name for ttl on conn (which the lease owns from then on: closed by
// Release, or here on failure) and starts its renewal. parent bounds the lease's Context.
func AcquireLease(parent context.Context, conn LeaseConn, name string, ttl time.Duration, opt LeaseOptions) (*Lease, error) {
	every := opt.RenewEvery
	if every == 0 {
		every = ttl / 3
	}
	switch {
	case name == "":
		conn.Close()
		return nil, errors.New("pgfencing: a lease's name is a non-empty string")
	case ttl <= 0:
		conn.Close()
		return nil, fmt.Errorf("pgfencing: a lease's TTL must be positive, not %v", ttl)
	case every <= 0 || every >= ttl:
		conn.Close()
		return nil, fmt.Errorf("pgfencing: RenewEvery must be positive and shorter than the TTL (%v), not %v", ttl, every)
	}
	token, err := conn.Acquire(parent, name, ttl, opt.Wait)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if err := CheckToken(token); err != nil {
		conn.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(parent)
	l := &Lease{Name: name, TTL: ttl, token: token, conn: conn, ctx: ctx, cancel: cancel,
		stop: make(chan struct{}), done: make(chan struct{})}
	go l.renew(every)
	return l, nil
}

// Token is the lease's fencing token.
func (l *Lease) Token() int64 { return l.token }

// Context is cancelled when the lease is lost (or released, or parent is done).
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease holds; after a failed renewal, an *Error with code FT003 saying why.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Check returns Err(): call it before each write (RunWithLease calls it before committing).
func (l *Lease) Check() error { return l.Err() }

func (l *Lease) renew(every time.Duration) {
	defer close(l.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(context.Background(), every)
			err := l.conn.Renew(rctx, l.token, l.TTL)
			cancel()
			if err != nil {
				why := err.Error()
				var fe *Error
				if errors.As(err, &fe) {
					why = fe.Message
				}
				l.mu.Lock()
				l.err = NewError(CodeLeaseLost,
					fmt.Sprintf("lease %q (token %d) was lost: %s", l.Name, l.token, why), "", "", err)
				l.mu.Unlock()
				l.cancel()
				return
			}
		}
	}
}

// Release stops the renewal and releases the lease: true if it was still held. The lease's
// connection is closed. A second Release returns false.
func (l *Lease) Release(ctx context.Context) (bool, error) {
	first := false
	l.released.Do(func() { first = true; close(l.stop) })
	if !first {
		return false, nil
	}
	<-l.done
	defer l.conn.Close()
	defer l.cancel()
	if l.Err() != nil {
		return false, nil
	}
	return l.conn.Release(ctx, l.token)
}
