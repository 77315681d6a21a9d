// Package etcdfence: fencing tokens from etcd's locks (etcd 3.4's clientv3 and its concurrency
// package; with etcd 3.5 the import paths are go.etcd.io/etcd/client/v3 and
// go.etcd.io/etcd/client/v3/concurrency). The token of a lock is the revision in its Lock
// response's header, Mutex.Header().Revision: the revision at which the lock was granted, the
// same number as `etcdctl lock`'s ETCD_LOCK_REV and pg_fencing's own etcd worker's tokens.
package etcdfence

import (
	"context"
	"errors"
	"fmt"

	pgfencing "github.com/pg-fencing/pg_fencing/clients/go"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

// Token is the fencing token of a lock m holds: Header().Revision of its Lock response.
func Token(m *concurrency.Mutex) (int64, error) {
	h := m.Header()
	if h == nil || h.Revision < 1 {
		return 0, errors.New("etcdfence: the mutex is not locked (no Lock response header)")
	}
	return h.Revision, nil
}

// Lock takes lock name in session s and returns the mutex and its token. etcd 3.4's
// Mutex.Lock can return after a wait although the session's key was deleted meanwhile (its lease
// revoked or expired, or the key deleted, and perhaps created again by a second Lock after another
// waiter queued): the lock's keys are read back, and unless the session's key is the oldest under
// the lock's prefix (the owner), under its lease, the lock is not granted (an *pgfencing.Error
// with code FT003).
func Lock(ctx context.Context, s *concurrency.Session, name string) (*concurrency.Mutex, int64, error) {
	m := concurrency.NewMutex(s, name)
	if err := m.Lock(ctx); err != nil {
		return nil, 0, err
	}
	token, err := Token(m)
	if err != nil {
		return nil, 0, err
	}
	// The owner is the oldest key under the lock's prefix; ours must be it, under our lease (a
	// key deleted while it waited, and perhaps created again by a second Lock on the session
	// after another waiter queued, is not).
	r, err := s.Client().Get(ctx, name+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		_ = m.Unlock(context.Background())
		return nil, 0, err
	}
	if len(r.Kvs) == 0 || string(r.Kvs[0].Key) != m.Key() || r.Kvs[0].Lease != int64(s.Lease()) {
		return nil, 0, pgfencing.NewError(pgfencing.CodeLeaseLost,
			fmt.Sprintf("etcd lock %q was not granted: its key was deleted while it waited (the session's lease expired or was revoked, or the key deleted), so it is not the lock's owner", name),
			"", "", nil)
	}
	return m, token, nil
}

// RunWithLock takes etcd lock name under a new session with a TTL of ttl seconds (kept alive by
// the client), runs fn with its token and a context cancelled when the session ends (its lease
// lost), then unlocks and closes the session. fn writes with pgxfence.Fenced or sqlfence.Fenced
// and that token; a session lost before fn returns gives an *pgfencing.Error with code FT003.
func RunWithLock(ctx context.Context, cli *clientv3.Client, name string, ttl int, fn func(ctx context.Context, token int64) error) error {
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	if err != nil {
		return err
	}
	defer s.Close()
	m, token, err := Lock(ctx, s, name)
	if err != nil {
		return err
	}
	defer m.Unlock(context.Background())
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.Done():
			cancel()
		case <-fctx.Done():
		}
	}()
	err = fn(fctx, token)
	if err == nil {
		return nil // fn's writes committed, each checked with the token when it was made
	}
	select {
	case <-s.Done():
		return pgfencing.NewError(pgfencing.CodeLeaseLost,
			fmt.Sprintf("etcd lock %q (token %d) was lost: its session's lease ended", name, token), "", "", err)
	default:
	}
	return err
}
