// Package pgfencing is the Go side of pg_fencing, the PostgreSQL extension that refuses a write
// whose fencing token is below the highest one it has seen: the token's checks, typed errors for
// its SQLSTATEs (FT001 … FT006) and PostgreSQL leases renewed in the background. The drivers'
// parts live in sub-packages: pgxfence (pgx v4, its pool), sqlfence (database/sql, lib/pq) and
// etcdfence (the token of etcd's concurrency.Mutex).
//
// A fenced transaction sends BEGIN and the token in one simple-protocol query,
//
//	BEGIN; SELECT pg_catalog.set_config('pg_fencing.token', '<token>', true)
//
// instead of the driver's own BEGIN: it takes as many round trips as the same transaction
// unfenced, and the token ends with the transaction (the next user of a pooled connection never
// carries it).
package pgfencing

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ErrBadToken is returned (wrapped) for a token that is not positive: tokens are 1 … 2^63 − 1.
var ErrBadToken = errors.New("pgfencing: a fencing token is a positive 64-bit integer")

// CheckToken returns an error wrapping ErrBadToken unless token is positive.
func CheckToken(token int64) error {
	if token < 1 {
		return fmt.Errorf("%w (1 .. 9223372036854775807), not %d", ErrBadToken, token)
	}
	return nil
}

// BeginSQL is the one query that opens a fenced transaction: BEGIN and the token set with
// set_config(…, true) (SET LOCAL: transaction-scoped; not the SET LOCAL statement, whose
// constant PostgreSQL 15's pg_stat_statements keeps, one entry per token). Only the checked
// integer is written into it.
func BeginSQL(token int64) (string, error) {
	if err := CheckToken(token); err != nil {
		return "", err
	}
	return "BEGIN; SELECT pg_catalog.set_config('pg_fencing.token', '" + strconv.FormatInt(token, 10) + "', true)", nil
}

// SQLSTATEs of pg_fencing (docs/sqlstates.md of the extension).
const (
	CodeStaleToken             = "FT001"
	CodeNoToken                = "FT002"
	CodeLeaseLost              = "FT003"
	CodeProtectionInactive     = "FT004"
	CodeLockServiceUnavailable = "FT005"
	CodeNotCurrentHolder       = "FT006"
)

// Error is a write or lock operation refused by pg_fencing (SQLSTATE class FT). Compare with the
// sentinels by code: errors.Is(err, pgfencing.ErrStaleToken). Err is the driver's error.
type Error struct {
	Code    string
	Message string
	Detail  string
	Hint    string
	// From a stale token's message (FT001): the refused token, the resource (resource mode) or
	// the row and its table (per-row mode), and the high-water mark from the detail.
	Token     int64
	Resource  string
	Row       string
	Table     string
	HighWater int64
	Err       error
}

// Sentinels for errors.Is: an *Error matches the sentinel with the same Code.
var (
	ErrStaleToken             = &Error{Code: CodeStaleToken, Message: "stale fencing token"}
	ErrNoToken                = &Error{Code: CodeNoToken, Message: "no fencing token"}
	ErrLeaseLost              = &Error{Code: CodeLeaseLost, Message: "lock or lease lost"}
	ErrProtectionInactive     = &Error{Code: CodeProtectionInactive, Message: "protection inactive"}
	ErrLockServiceUnavailable = &Error{Code: CodeLockServiceUnavailable, Message: "lock service unavailable"}
	ErrNotCurrentHolder       = &Error{Code: CodeNotCurrentHolder, Message: "not the current holder"}
)

// The server's FT001 message is exactly `stale fencing token N for resource "<name>"` or
// `... for row <key> of table <table>`, the name and key written as they are (not escaped): the
// resource is everything between the first and the last quote, the table what follows the last
// " of table ". The detail ends with "... is <mark>.".
var (
	staleRe = regexp.MustCompile(`(?s)\Astale fencing token (\d+) for (?:(resource) "(.*)"|row (.*) of table (.*))\z`)
	markRe  = regexp.MustCompile(`(?s)high-water mark of .* is (\d+)\.?\z`)
)

// ErrRolledBack: the fenced transaction could not commit because a statement in it failed (and
// fn went on after its error), so PostgreSQL had aborted it; it was rolled back, nothing of it
// committed.
var ErrRolledBack = errors.New("pgfencing: the fenced transaction was rolled back: a statement in it failed (fn went on after its error), so nothing was committed")

// ErrEndedByFn: fn ended the fenced transaction itself (a COMMIT or ROLLBACK statement inside
// it), so the helper cannot tell whether its writes committed; never reported as success. Send no
// transaction control inside fn: return an error to roll back.
var ErrEndedByFn = errors.New("pgfencing: fn ended the fenced transaction itself (a COMMIT or ROLLBACK inside it), so whether its writes committed is unknown; end nothing inside fn (return an error to roll back)")

// NewError builds the *Error for a server error's fields (the drivers' packages call it).
func NewError(code, message, detail, hint string, cause error) *Error {
	e := &Error{Code: code, Message: message, Detail: detail, Hint: hint, Err: cause}
	if m := staleRe.FindStringSubmatch(message); m != nil {
		e.Token, _ = strconv.ParseInt(m[1], 10, 64)
		if m[2] == "resource" {
			e.Resource = m[3]
		} else {
			e.Row, e.Table = m[4], m[5]
		}
	}
	if h := markRe.FindStringSubmatch(detail); h != nil {
		e.HighWater, _ = strconv.ParseInt(h[1], 10, 64)
	}
	return e
}

func (e *Error) Error() string {
	return "pg_fencing " + e.Code + ": " + e.Message
}

// Unwrap gives the driver's error.
func (e *Error) Unwrap() error { return e.Err }

// Is matches a sentinel (or any *Error) with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Superseded is true for FT001, FT003 and FT006: the token will never be accepted again (a newer
// holder exists, or the lock or lease is gone). Stop, do not retry with this token, and do not
// report the job as failed: another holder owns it now.
func (e *Error) Superseded() bool {
	return e.Code == CodeStaleToken || e.Code == CodeLeaseLost || e.Code == CodeNotCurrentHolder
}

// IsFencing is true for a SQLSTATE of class FT.
func IsFencing(code string) bool { return strings.HasPrefix(code, "FT") }
