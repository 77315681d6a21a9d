package pgfencing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// LeaseConn is a connection of its own for one PostgreSQL lease, as the drivers' packages give
// it (sqlfence.LeaseConn, pgxfence.LeaseConn): fencing_lease_acquire / _renew / _release on it,
// and how long the lease holding a token still has (after a grant that waited).
type LeaseConn interface {
	Acquire(ctx context.Context, name string, ttl, wait time.Duration) (int64, error)
	Remaining(ctx context.Context, token int64) (time.Duration, error)
	Renew(ctx context.Context, token int64, ttl time.Duration) error
	Release(ctx context.Context, token int64) (bool, error)
	Close() error
}

// Lease is a PostgreSQL lease (fencing_lease_acquire) renewed every RenewEvery (a third of the
// TTL unless set) by a goroutine on its own connection until Release. It is lost when a renewal
// fails (the lease ended, or its connection broke and it may have) and when its TTL passes
// since the last confirmed grant or renewal was sent (a renewal stuck on a stalled connection
// cannot keep it alive; the server's own expiry is never earlier). Its Context is cancelled
// then, and Err says why, as an *Error with code FT003.
type Lease struct {
	Name  string
	TTL   time.Duration
	token int64

	conn   LeaseConn
	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	done   chan struct{}
	every  time.Duration

	mu         sync.Mutex
	err        error
	validUntil time.Time // monotonic: before it the lease cannot have expired
	released   sync.Once
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
	sent := time.Now()
	token, err := conn.Acquire(parent, name, ttl, opt.Wait)
	if err == nil {
		err = CheckToken(token)
	}
	valid := sent.Add(ttl)
	if err == nil && opt.Wait > 0 {
		// Granted at some moment of the wait: ask how long it has left.
		sent = time.Now()
		var left time.Duration
		left, err = conn.Remaining(parent, token)
		valid = sent.Add(left)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(parent)
	l := &Lease{Name: name, TTL: ttl, token: token, conn: conn, ctx: ctx, cancel: cancel,
		stop: make(chan struct{}), done: make(chan struct{}), every: every, validUntil: valid}
	go l.renew()
	return l, nil
}

// Token is the lease's fencing token.
func (l *Lease) Token() int64 { return l.token }

// Context is cancelled when the lease is lost (or released, or parent is done).
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease holds; once it is lost, an *Error with code FT003 saying why.
func (l *Lease) Err() error {
	l.mu.Lock()
	expired := l.err == nil && !time.Now().Before(l.validUntil)
	l.mu.Unlock()
	if expired {
		l.lose(fmt.Sprintf("no renewal got through within its TTL (%v)", l.TTL), nil)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Check returns Err(): call it before each write (RunWithLease calls it before committing).
func (l *Lease) Check() error { return l.Err() }

func (l *Lease) lose(why string, cause error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = NewError(CodeLeaseLost, fmt.Sprintf("lease %q (token %d) was lost: %s", l.Name, l.token, why), "", "", cause)
	}
	l.mu.Unlock()
	l.cancel()
}

func (l *Lease) until() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Until(l.validUntil)
}

func (l *Lease) renew() {
	defer close(l.done)
	expired := func() { l.lose(fmt.Sprintf("no renewal got through within its TTL (%v)", l.TTL), nil) }
	for {
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-time.After(l.until()):
			expired()
			return
		case <-time.After(l.every):
		}
		sent := time.Now()
		result := make(chan error, 1)
		go func() {
			rctx, cancel := context.WithTimeout(context.Background(), l.every)
			defer cancel()
			result <- l.conn.Renew(rctx, l.token, l.TTL)
		}()
		select {
		case err := <-result:
			if err != nil {
				why := err.Error()
				var fe *Error
				if errors.As(err, &fe) {
					why = fe.Message
				}
				l.lose(why, err)
				return
			}
			l.mu.Lock()
			if v := sent.Add(l.TTL); v.After(l.validUntil) {
				l.validUntil = v
			}
			l.mu.Unlock()
		case <-time.After(l.until()):
			// The renewal is stuck (a stalled connection; some drivers do not give up on a
			// cancelled context while a read blocks): the lease may have expired by now.
			expired()
			return
		case <-l.stop:
			return
		}
	}
}

// Release stops the renewal and releases the lease: true if it was still held. The lease's
// connection is closed. A renewal stuck on a stalled connection is not waited for beyond one
// renewal period (then false). A second Release returns false.
func (l *Lease) Release(ctx context.Context) (bool, error) {
	first := false
	l.released.Do(func() { first = true; close(l.stop) })
	if !first {
		return false, nil
	}
	defer l.cancel()
	select {
	case <-l.done:
	case <-time.After(l.every):
		go l.conn.Close() // may block behind the stuck call: not here
		return false, nil
	}
	if l.Err() != nil {
		go l.conn.Close()
		return false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, l.every)
	defer cancel()
	type answer struct {
		ok  bool
		err error
	}
	out := make(chan answer, 1)
	go func() { ok, err := l.conn.Release(rctx, l.token); out <- answer{ok, err} }()
	select {
	case a := <-out:
		l.conn.Close()
		return a.ok, a.err
	case <-time.After(l.every):
		go l.conn.Close()
		return false, nil
	}
}
