// Types of pg-fencing/drizzle (lib/drizzle.js).
import type { Token } from './index';

/** Run fn(db) with a Drizzle database on one client whose transaction is fenced by token. */
export declare function fencedDb<T = unknown>(poolOrClient: any, token: Token, fn: (db: any) => Promise<T>, config?: object): Promise<T>;
