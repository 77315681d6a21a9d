'use strict';
// pg_fencing from node-postgres: `fenced(poolOrClient, token, fn)` (a transaction fenced by a
// token, with no extra round trip), typed errors for FT001…FT006, and `Lease` / `runWithLease`
// for PostgreSQL leases (renewed on their own connection, an AbortSignal aborted on loss).

const errors = require('./errors');

const { LeaseLost, RolledBack, fromError } = errors;
const MAX_TOKEN = (1n << 63n) - 1n;

/**
 * The token as a BigInt: a positive bigint given as a BigInt, a safe integer Number, or a
 * string of decimal digits (node-postgres returns `bigint` columns as strings). TypeError for
 * anything else, RangeError outside 1 … 2^63 − 1. Only this BigInt is ever written into SQL.
 * @param {bigint | number | string} token
 * @returns {bigint}
 */
function checkToken(token) {
  let t;
  if (typeof token === 'bigint') {
    t = token;
  } else if (typeof token === 'number') {
    if (!Number.isSafeInteger(token)) {
      throw new TypeError(`a fencing token given as a Number must be a safe integer, not ${token}`);
    }
    t = BigInt(token);
  } else if (typeof token === 'string' && /^[0-9]{1,19}$/.test(token)) {
    t = BigInt(token);
  } else {
    throw new TypeError(
      `a fencing token is a BigInt, a safe integer or a string of digits, not ${
        typeof token === 'string' ? JSON.stringify(token) : typeof token
      }`,
    );
  }
  if (t < 1n || t > MAX_TOKEN) {
    throw new RangeError(`fencing token ${t} is out of range (1 .. ${MAX_TOKEN})`);
  }
  return t;
}

/**
 * One simple-protocol query that opens the transaction and gives it the token
 * (`set_config(…, true)`, i.e. SET LOCAL: transaction-scoped), sent instead of `BEGIN`, so a
 * fenced transaction takes as many round trips as an unfenced one. Not `SET LOCAL
 * pg_fencing.token = '…'`: PostgreSQL 15 keeps a utility statement's constants in
 * pg_stat_statements (one entry per token); a SELECT's are normalised on every version.
 * @param {bigint | number | string} token
 */
function beginFenced(token) {
  return `BEGIN; SELECT set_config('pg_fencing.token', '${checkToken(token)}', true)`;
}

function isPool(x) {
  // pg.Pool (and pools shaped like it) count their clients; a Client or PoolClient does not.
  return x && typeof x.connect === 'function' && 'totalCount' in x && 'idleCount' in x;
}

/**
 * Run `fn(client)` in a transaction fenced by `token` on `poolOrClient` (a pg.Pool: a client is
 * taken for the transaction and given back; a pg.Client or PoolClient not in a transaction).
 * Commits when `fn` resolves (its value is returned), rolls back when it throws (the error is
 * rethrown; an FT SQLSTATE as its typed error, the driver's error as `cause`).
 * @template T
 * @param {*} poolOrClient
 * @param {bigint | number | string} token
 * @param {(client: *) => Promise<T>} fn
 * @returns {Promise<T>}
 */
async function fenced(poolOrClient, token, fn) {
  const begin = beginFenced(token);
  if (typeof fn !== 'function') throw new TypeError('fenced(poolOrClient, token, fn): fn is a function');
  const pooled = isPool(poolOrClient);
  const client = pooled ? await poolOrClient.connect() : poolOrClient;
  let broken;
  try {
    // node-postgres 8.11 and later know the server's transaction status ('I' when idle).
    const status = typeof client.getTransactionStatus === 'function' ? client.getTransactionStatus() : null;
    if (status !== null && status !== undefined && status !== 'I') {
      throw new Error('fenced() starts its own transaction: the connection is in one');
    }
    let result;
    try {
      await client.query(begin);
      result = await fn(client);
    } catch (e) {
      try {
        await client.query('ROLLBACK');
      } catch (rollbackError) {
        broken = rollbackError; // the connection is unusable: a pool must not lend it again
      }
      throw fromError(e) || e;
    }
    if (typeof client.getTransactionStatus === 'function' && client.getTransactionStatus() === 'E') {
      // A statement failed and fn caught its error: the transaction can only roll back.
      try {
        await client.query('ROLLBACK');
      } catch (rollbackError) {
        broken = rollbackError;
      }
      throw new RolledBack();
    }
    let done;
    try {
      done = await client.query('COMMIT');
    } catch (e) {
      if (!e || typeof e.code !== 'string') broken = e; // not the server's answer: connection lost
      throw fromError(e) || e;
    }
    // PostgreSQL answers COMMIT of an aborted transaction with ROLLBACK (and no error).
    if (done && done.command === 'ROLLBACK') throw new RolledBack();
    return result;
  } finally {
    if (pooled) client.release(broken);
  }
}

/**
 * A PostgreSQL lease (`fencing_lease_acquire`), renewed every third of its TTL on a connection
 * of its own; `signal` is aborted (with a LeaseLost as its reason) when a renewal fails.
 */
class Lease {
  /**
   * @param {string | object} config node-postgres connection settings (a URL or a ClientConfig)
   * @param {string} name the lease's name
   * @param {{ttlMs: number, waitMs?: number, renewEveryMs?: number}} options
   */
  constructor(config, name, options) {
    if (typeof name !== 'string' || name.length === 0) throw new TypeError("a lease's name is a non-empty string");
    const { ttlMs, waitMs = 0, renewEveryMs } = options || {};
    if (!(Number.isFinite(ttlMs) && ttlMs > 0)) throw new RangeError(`a lease's ttlMs must be positive, not ${ttlMs}`);
    if (!(Number.isFinite(waitMs) && waitMs >= 0)) throw new RangeError(`waitMs must be 0 or more, not ${waitMs}`);
    this.renewEveryMs = renewEveryMs === undefined ? ttlMs / 3 : renewEveryMs;
    if (!(this.renewEveryMs > 0 && this.renewEveryMs < ttlMs)) {
      throw new RangeError('renewEveryMs must be positive and shorter than ttlMs');
    }
    this.config = config;
    this.name = name;
    this.ttlMs = ttlMs;
    this.waitMs = waitMs;
    /** @type {bigint | undefined} */
    this.token = undefined;
    /** why the lease was lost (a LeaseLost), once it was */
    this.error = undefined;
    this.controller = new AbortController();
    /** aborted when the lease is lost; its reason is the LeaseLost */
    this.signal = this.controller.signal;
    this.client = undefined;
    this.timer = undefined;
    this.renewing = undefined;
    /** performance.now() before which the lease cannot have expired (last confirmed grant or
     * renewal's send time plus the TTL); the signal is aborted when it passes unrenewed */
    this.validUntil = 0;
    this.deadline = undefined;
  }

  /** Take a lease: `new Lease(...)` and `acquire()`. */
  static async acquire(config, name, options) {
    return new Lease(config, name, options).acquire();
  }

  get lost() {
    return this.signal.aborted;
  }

  /** The backend pid of the lease's own connection. */
  get backendPid() {
    return this.client ? this.client.processID : undefined;
  }

  async acquire() {
    const { Client } = require('pg');
    this.client = new Client(this.config);
    // An idle connection that breaks reports it here; without a listener the process would end.
    this.client.on('error', (e) => this.lose(e));
    await this.client.connect();
    try {
      let sent = performance.now();
      const r = await this.client.query(
        'SELECT fencing_lease_acquire($1, make_interval(secs => $2), make_interval(secs => $3))::text AS token',
        [this.name, this.ttlMs / 1000, this.waitMs / 1000],
      );
      this.token = checkToken(r.rows[0].token);
      if (this.waitMs > 0) {
        // Granted at some moment of the wait: ask how long it has left.
        sent = performance.now();
        const left = await this.client.query(
          'SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 AS s FROM fencing_leases WHERE token = $1',
          [this.token.toString()],
        );
        this.confirmed(sent, left.rows.length ? left.rows[0].s * 1000 : 0);
      } else {
        this.confirmed(sent, this.ttlMs);
      }
    } catch (e) {
      await this.client.end().catch(() => {});
      throw fromError(e) || e;
    }
    this.schedule();
    return this;
  }

  /** A grant or renewal sent at `sent` (performance.now()) holds for `forMs` more. */
  confirmed(sent, forMs) {
    this.validUntil = Math.max(this.validUntil, sent + forMs);
    if (this.deadline) clearTimeout(this.deadline);
    if (this.lost || this.timer === null) return;
    this.armDeadline();
  }

  /** Abort the signal when validUntil passes unrenewed (timers may fire a little early: re-arm). */
  armDeadline() {
    this.deadline = setTimeout(() => {
      if (this.lost || this.timer === null) return;
      if (performance.now() >= this.validUntil) {
        this.lose(new Error(`no renewal got through within its TTL (${this.ttlMs} ms)`));
      } else {
        this.armDeadline();
      }
    }, Math.max(1, Math.ceil(this.validUntil - performance.now())));
    this.deadline.unref?.();
  }

  schedule() {
    this.timer = setTimeout(() => {
      const sent = performance.now();
      this.renewing = this.client
        .query('SELECT fencing_lease_renew($1, make_interval(secs => $2))', [
          this.token.toString(),
          this.ttlMs / 1000,
        ])
        .then(
          () => {
            this.confirmed(sent, this.ttlMs);
            if (!this.lost && this.timer !== null) this.schedule();
          },
          (e) => this.lose(e),
        );
    }, this.renewEveryMs);
  }

  lose(e) {
    if (this.lost) return;
    const typed = fromError(e);
    const why = typed ? typed.message : `renewal failed: ${e && e.message ? e.message : e}`;
    this.error = new LeaseLost(`lease "${this.name}" (token ${this.token}) was lost: ${why}`, { cause: e });
    this.controller.abort(this.error);
  }

  /** Throw LeaseLost if the lease was lost, or may have expired because no renewal got through
   * within its TTL (call it before each write). */
  check() {
    if (!this.lost && performance.now() >= this.validUntil) {
      this.lose(new Error(`no renewal got through within its TTL (${this.ttlMs} ms)`));
    }
    if (this.lost) throw this.error;
  }

  /** Stop renewing and release the lease: true if it was still held. */
  async release() {
    if (this.timer) clearTimeout(this.timer);
    if (this.deadline) clearTimeout(this.deadline);
    this.timer = null;
    // A renewal stuck on a stalled connection is not waited for beyond one renewal period.
    const bounded = (p) => Promise.race([p, new Promise((resolve) => {
      setTimeout(() => resolve('timeout'), this.renewEveryMs).unref?.();
    })]);
    if (this.renewing && (await bounded(this.renewing.then(() => 'done'))) === 'timeout') {
      this.client.connection?.stream?.destroy?.();
      return false;
    }
    try {
      if (this.lost || this.token === undefined) return false;
      const r = await bounded(this.client.query('SELECT fencing_lease_release($1) AS released', [this.token.toString()]));
      return r !== 'timeout' && r.rows[0].released === true;
    } catch (e) {
      return false;
    } finally {
      if ((await bounded(this.client.end().catch(() => {}))) === 'timeout') this.client.connection?.stream?.destroy?.();
    }
  }
}

/**
 * Take lease `name`, run `fn(client, lease)` in a transaction on `pool` fenced by its token while
 * the lease is renewed, check the lease before committing, release it; resolves to what `fn`
 * resolves to. LeaseLost if the lease was lost (nothing committed), StaleToken if a newer holder
 * wrote. The lease's own connection uses `options.leaseConfig`, else `pool.options`.
 * @template T
 * @param {*} pool a pg.Pool
 * @param {string} name
 * @param {(client: *, lease: Lease) => Promise<T>} fn
 * @param {{ttlMs: number, waitMs?: number, leaseConfig?: string | object}} options
 * @returns {Promise<T>}
 */
async function runWithLease(pool, name, fn, options) {
  const { leaseConfig, ...leaseOptions } = options || {};
  const lease = await Lease.acquire(leaseConfig || pool.options, name, leaseOptions);
  try {
    return await fenced(pool, lease.token, async (client) => {
      const result = await fn(client, lease);
      lease.check();
      return result;
    });
  } finally {
    await lease.release();
  }
}

// Named one by one as shorthand properties (not spread, not `a: b.c`), so that an ES module's
// `import { StaleToken } from 'pg-fencing'` finds them: Node's CommonJS named-export detection
// reads only this literal shape.
const {
  FencingError, StaleToken, NoToken, ProtectionInactive, LockServiceUnavailable, NotCurrentHolder,
} = errors;
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
  MAX_TOKEN,
  checkToken,
  beginFenced,
  fenced,
  Lease,
  runWithLease,
};
