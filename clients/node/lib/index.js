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

// Per client (a pg.Client or PoolClient, forgotten with it): may its token go as
// `SET LOCAL pg_fencing.token = '…'`? Learnt by the first fenced transaction on it (`beginFenced`).
const setLocal = new WeakMap();

// The probe's second row: the server is PostgreSQL 16 or later (its pg_stat_statements
// normalises a SET's constants) or has no pg_stat_statements (its settings exist only where it is
// preloaded, and preloading needs a restart, which ends the connection).
const PROBE =
  " UNION ALL SELECT NULL WHERE pg_catalog.current_setting('server_version_num')::int OPERATOR(pg_catalog.>=) 160000" +
  " OR pg_catalog.current_setting('pg_stat_statements.max', true) IS NULL";

/**
 * One simple-protocol query that opens the transaction and gives it the token, transaction-scoped,
 * sent instead of `BEGIN`, so a fenced transaction takes as many round trips as an unfenced one;
 * and whether its last result answers the probe (`learn`). `SET LOCAL pg_fencing.token = '…'`
 * where the client was learnt to allow it, else `SELECT pg_catalog.set_config('pg_fencing.token', '…', true)`:
 * the SELECT costs a plan and a row (BENCHMARKS.md, "Issue 46"), but PostgreSQL 15 keeps a utility
 * statement's constants in pg_stat_statements (one entry per token) where a SELECT's are
 * normalised on every version. The first transaction on a client asks, in the same query.
 * @param {*} client
 * @param {bigint | number | string} token
 * @returns {{sql: string, probing: boolean}}
 */
function beginFenced(client, token) {
  const t = checkToken(token);
  const known = client !== null && typeof client === 'object' ? setLocal.get(client) : undefined;
  if (known === true) return { sql: `BEGIN; SET LOCAL pg_fencing.token = '${t}'`, probing: false };
  // pg_catalog's set_config, whatever the session's search_path puts before it.
  const select = `BEGIN; SELECT pg_catalog.set_config('pg_fencing.token', '${t}', true)`;
  if (known === false) return { sql: select, probing: false };
  return { sql: select + PROBE, probing: true };
}

// Clients with a fenced transaction in progress: a second fenced() on one of them (a client
// shared by concurrent callers) would replace the first one's token inside its transaction, so
// that the first one's writes went out with the second one's token.
const busy = new WeakSet();

/** Remember the probe's answer: the rows of the query's last statement (2: `SET LOCAL`). */
function learn(client, results) {
  const last = Array.isArray(results) ? results[results.length - 1] : results;
  if (client !== null && typeof client === 'object' && last) setLocal.set(client, last.rowCount === 2);
}

/** fn ended the fenced transaction itself: never reported as committed. */
function endedByFn() {
  return new Error('fenced(): fn ended the fenced transaction itself (a COMMIT or ROLLBACK inside it), so '
    + 'whether its writes committed is unknown; end nothing inside fn (throw to roll back)');
}

function isPool(x) {
  // pg.Pool (and pools shaped like it) count their clients; a Client or PoolClient does not.
  return x && typeof x.connect === 'function' && 'totalCount' in x && 'idleCount' in x;
}

/**
 * Run `fn(client)` in a transaction fenced by `token` on `poolOrClient` (a pg.Pool: a client is
 * taken for the transaction and given back; a pg.Client or PoolClient not in a transaction).
 * Commits when `fn` resolves (its value is returned), rolls back when it throws (the error is
 * rethrown; an FT SQLSTATE as its typed error, the driver's error as `cause`). RolledBack when a
 * statement failed and `fn` caught its error; an Error ("… ended the fenced transaction …") when
 * `fn` sent COMMIT or ROLLBACK itself, never success.
 * @template T
 * @param {*} poolOrClient
 * @param {bigint | number | string} token
 * @param {(client: *) => Promise<T>} fn
 * @returns {Promise<T>}
 */
async function fenced(poolOrClient, token, fn) {
  checkToken(token);
  if (typeof fn !== 'function') throw new TypeError('fenced(poolOrClient, token, fn): fn is a function');
  const pooled = isPool(poolOrClient);
  const client = pooled ? await poolOrClient.connect() : poolOrClient;
  let broken;
  if (busy.has(client)) {
    if (pooled) client.release();
    throw new Error('fenced(): the client already runs a fenced transaction (shared by concurrent '
      + 'callers?); one transaction at a time per client');
  }
  busy.add(client);
  // A pool's client goes back to the pool when fenced() ends: released inside fn, the next
  // borrower would run in the fenced transaction, with its token.
  const ownRelease = pooled ? client.release : undefined;
  if (pooled) {
    client.release = () => {
      throw new Error('fenced(): the client goes back to the pool when fenced() ends; do not release it inside fn');
    };
  }
  try {
    // node-postgres 8.11 and later know the server's transaction status ('I' when idle).
    const status = typeof client.getTransactionStatus === 'function' ? client.getTransactionStatus() : null;
    if (status !== null && status !== undefined && status !== 'I') {
      throw new Error('fenced() starts its own transaction: the connection is in one');
    }
    let result;
    try {
      const begin = beginFenced(client, token);
      const started = await client.query(begin.sql);
      if (begin.probing) learn(client, started);
      result = await fn(client);
    } catch (e) {
      try {
        await client.query('ROLLBACK');
      } catch (rollbackError) {
        broken = rollbackError; // the connection is unusable: a pool must not lend it again
      }
      throw fromError(e) || e;
    }
    const knows = typeof client.getTransactionStatus === 'function';
    if (knows && client.getTransactionStatus() === 'E') {
      // A statement failed and fn caught its error: the transaction can only roll back.
      try {
        await client.query('ROLLBACK');
      } catch (rollbackError) {
        broken = rollbackError;
      }
      throw new RolledBack();
    }
    // fn sent COMMIT or ROLLBACK itself: a COMMIT now would answer with a warning, no error.
    if (knows && client.getTransactionStatus() === 'I') throw endedByFn();
    let done;
    try {
      // Where node-postgres does not tell the status (before 8.11), the SAVEPOINT in the same
      // simple query fails instead: 25P02 if the transaction is aborted, 25P01 if fn ended it.
      done = await client.query(knows ? 'COMMIT' : 'SAVEPOINT pg_fencing_commit; COMMIT');
    } catch (e) {
      if (!e || typeof e.code !== 'string') broken = e; // not the server's answer: connection lost
      if (!knows && e && (e.code === '25P02' || e.code === '25P01')) {
        try {
          await client.query('ROLLBACK');
        } catch (rollbackError) {
          broken = rollbackError;
        }
        throw e.code === '25P02' ? new RolledBack() : endedByFn();
      }
      throw fromError(e) || e;
    }
    // PostgreSQL answers COMMIT of an aborted transaction with ROLLBACK (and no error).
    if (Array.isArray(done)) done = done[done.length - 1];
    if (done && done.command === 'ROLLBACK') throw new RolledBack();
    return result;
  } finally {
    busy.delete(client);
    if (pooled) {
      client.release = ownRelease;
      client.release(broken);
    }
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
