// Types of pg-fencing (lib/index.js).

export declare const MAX_TOKEN: bigint;
export type Token = bigint | number | string;

export declare class FencingError extends Error {
  constructor(message: string, fields?: { detail?: string; hint?: string; code?: string; cause?: unknown });
  /** the SQLSTATE: FT001 … FT006 */
  code: string;
  /** true for FT001, FT003, FT006: stop, never retry with this token */
  superseded: boolean;
  detail?: string;
  hint?: string;
  /** the refused token (FT001) */
  token?: bigint;
  /** the resource (resource mode, FT001) */
  resource?: string;
  /** the row's key and its table (per-row mode, FT001) */
  row?: string;
  table?: string;
  /** the resource's or row's high-water mark (FT001) */
  highWater?: bigint;
}
export declare class StaleToken extends FencingError {}
export declare class NoToken extends FencingError {}
export declare class LeaseLost extends FencingError {}
export declare class ProtectionInactive extends FencingError {}
export declare class LockServiceUnavailable extends FencingError {}
export declare class NotCurrentHolder extends FencingError {}
/** The fenced transaction could not commit: a statement in it failed and fn caught its error. */
export declare class RolledBack extends Error {}

/** The typed error for a driver error with an FT SQLSTATE; undefined otherwise. */
export declare function fromError(err: unknown): FencingError | undefined;
/** The token as a BigInt (TypeError, RangeError outside 1 … 2^63 − 1). */
export declare function checkToken(token: Token): bigint;
/**
 * The query that opens client's fenced transaction and gives it the token: `BEGIN; SET LOCAL
 * pg_fencing.token = '<token>'` where the client was learnt to allow it (PostgreSQL 16+, or no
 * pg_stat_statements), else `BEGIN; SELECT set_config('pg_fencing.token', '<token>', true)`, the
 * first on a client with a probe (`probing`: its last result's rowCount is the answer).
 */
export declare function beginFenced(client: object, token: Token): { sql: string; probing: boolean };

/** Run fn(client) in a transaction fenced by token on a pg.Pool, pg.Client or PoolClient: RolledBack
 * if a statement failed and fn caught its error, an Error ("… ended the fenced transaction …") if fn
 * sent COMMIT or ROLLBACK itself. */
export declare function fenced<C = any, T = unknown>(poolOrClient: any, token: Token, fn: (client: C) => Promise<T>): Promise<T>;

export interface LeaseOptions {
  /** the lease's TTL in milliseconds */
  ttlMs: number;
  /** how long fencing_lease_acquire may wait for the current holder, in milliseconds (0) */
  waitMs?: number;
  /** renewal period in milliseconds (ttlMs / 3) */
  renewEveryMs?: number;
}

export declare class Lease {
  constructor(config: string | object, name: string, options: LeaseOptions);
  static acquire(config: string | object, name: string, options: LeaseOptions): Promise<Lease>;
  readonly name: string;
  readonly ttlMs: number;
  /** the lease's fencing token, once acquired */
  token: bigint | undefined;
  /** aborted when a renewal fails; its reason is the LeaseLost */
  readonly signal: AbortSignal;
  readonly lost: boolean;
  error: LeaseLost | undefined;
  /** performance.now() before which the lease cannot have expired */
  validUntil: number;
  readonly backendPid: number | undefined;
  acquire(): Promise<Lease>;
  /** Throws LeaseLost if the lease was lost, or no renewal got through within its TTL. */
  check(): void;
  /** Stop renewing and release: true if it was still held. */
  release(): Promise<boolean>;
}

/** Take the lease, run fn in a transaction fenced by its token, check the lease, commit, release. */
export declare function runWithLease<C = any, T = unknown>(
  pool: any,
  name: string,
  fn: (client: C, lease: Lease) => Promise<T>,
  options: LeaseOptions & { leaseConfig?: string | object },
): Promise<T>;
