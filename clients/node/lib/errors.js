'use strict';
// Typed errors for pg_fencing's SQLSTATEs, from node-postgres's DatabaseError (`fromError`).
// `superseded` is true where the token will never be accepted again (a newer holder exists, or
// the lock or lease is gone): stop, do not retry with this token, and do not report the job as
// failed (another holder owns it now). FT002/FT004/FT005 are faults to fix or retry.

// The server's FT001 message is exactly `stale fencing token N for resource "<name>"` or
// `... for row <key> of table <table>`, the name and key written as they are (not escaped): the
// resource is everything between the first and the last quote, the table what follows the last
// " of table ". The detail ends with "... is <mark>.".
const STALE = /^stale fencing token (\d+) for (?:resource "(.*)"|row (.*) of table (.*))$/s;
const MARK = /high-water mark of .* is (\d+)\.?$/s;

class FencingError extends Error {
  /**
   * @param {string} message the server's primary message
   * @param {{detail?: string, hint?: string, code?: string, cause?: unknown}} [fields]
   */
  constructor(message, fields = {}) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = new.target.name;
    if (fields.code) this.code = fields.code;
    this.detail = fields.detail;
    this.hint = fields.hint;
    const m = STALE.exec(message || '');
    /** the refused token (FT001), a BigInt */
    this.token = m ? BigInt(m[1]) : undefined;
    this.resource = m && m[2] !== undefined ? m[2] : undefined;
    this.row = m && m[3] !== undefined ? m[3] : undefined;
    this.table = m && m[4] !== undefined ? m[4] : undefined;
    const h = MARK.exec(fields.detail || '');
    /** the resource's or row's high-water mark (FT001), a BigInt */
    this.highWater = h ? BigInt(h[1]) : undefined;
  }
}
FencingError.prototype.code = 'FT000';
FencingError.prototype.superseded = false;

/** FT001: the token is below the high-water mark of the resource or row. */
class StaleToken extends FencingError {}
StaleToken.prototype.code = 'FT001';
StaleToken.prototype.superseded = true;

/** FT002: a write to a protected table without a token that counts. */
class NoToken extends FencingError {}
NoToken.prototype.code = 'FT002';

/** FT003: the token's lock or lease was lost; also thrown by `lease.check()`. */
class LeaseLost extends FencingError {}
LeaseLost.prototype.code = 'FT003';
LeaseLost.prototype.superseded = true;

/** FT004: the table's protection cannot hold right now (the detail says why). */
class ProtectionInactive extends FencingError {}
ProtectionInactive.prototype.code = 'FT004';

/** FT005: the lock service (etcd) is unreachable or went backwards; retry later. */
class LockServiceUnavailable extends FencingError {}
LockServiceUnavailable.prototype.code = 'FT005';

/** FT006: verify mode: the token is not the current holder's. */
class NotCurrentHolder extends FencingError {}
NotCurrentHolder.prototype.code = 'FT006';
NotCurrentHolder.prototype.superseded = true;

/**
 * The fenced transaction could not commit: a statement in it failed (and `fn` caught its
 * error), so PostgreSQL had aborted it; it was rolled back, nothing of it was committed.
 */
class RolledBack extends Error {
  constructor(message) {
    super(message || 'the fenced transaction was rolled back: a statement in it failed (its error was caught in fn), so nothing was committed');
    this.name = 'RolledBack';
  }
}

const BY_CODE = new Map(
  [StaleToken, NoToken, LeaseLost, ProtectionInactive, LockServiceUnavailable, NotCurrentHolder].map(
    (c) => [c.prototype.code, c],
  ),
);

/**
 * The typed error for a driver error whose SQLSTATE is of class FT; `undefined` otherwise.
 * @param {unknown} err
 * @returns {FencingError | undefined}
 */
function fromError(err) {
  // The driver's error itself, or one a library wrapped it in (Drizzle's DrizzleQueryError has
  // node-postgres's error as its `cause`).
  for (let e = err, depth = 0; e && typeof e === 'object' && depth < 4; e = e.cause, depth += 1) {
    if (e instanceof FencingError) return e;
    const code = e.code;
    if (typeof code === 'string' && code.startsWith('FT')) {
      const Cls = BY_CODE.get(code) || FencingError;
      return new Cls(e.message, { code, detail: e.detail, hint: e.hint, cause: err });
    }
  }
  return undefined;
}

module.exports = {
  FencingError,
  StaleToken,
  NoToken,
  LeaseLost,
  ProtectionInactive,
  LockServiceUnavailable,
  NotCurrentHolder,
  RolledBack,
  fromError,
};
