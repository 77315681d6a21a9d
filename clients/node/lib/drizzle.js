'use strict';
// pg_fencing with Drizzle ORM on node-postgres: `fencedDb(pool, token, fn)` runs `fn(db)` with a
// Drizzle database on one client whose transaction is fenced by `token` (see `fenced`).

const { fenced } = require('./index');

/**
 * @template T
 * @param {*} poolOrClient a pg.Pool, pg.Client or PoolClient
 * @param {bigint | number | string} token
 * @param {(db: *) => Promise<T>} fn receives `drizzle(client, config)`
 * @param {object} [config] Drizzle's config (schema, logger, casing)
 * @returns {Promise<T>}
 */
async function fencedDb(poolOrClient, token, fn, config) {
  const { drizzle } = require('drizzle-orm/node-postgres');
  return fenced(poolOrClient, token, (client) => fn(drizzle(client, config)));
}

module.exports = { fencedDb };
