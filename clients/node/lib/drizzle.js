'use strict';
// pg_fencing with Drizzle ORM on node-postgres: `fencedDb(pool, token, fn)` runs `fn(db)` with a
// Drizzle database on one client whose transaction is fenced by `token` (see `fenced`). fn runs
// in that one transaction: `db.transaction()` inside it is refused (Drizzle's own BEGIN and
// COMMIT would end the fenced transaction early and commit part of the work).

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
  return fenced(poolOrClient, token, (client) => fn(drizzle(guarded(client), config)));
}

// Statements that would end the fenced transaction early (Drizzle's db.transaction() sends
// `begin` and `commit` of its own; a nested tx.transaction() uses savepoints, which are fine).
const ENDS_TRANSACTION = /^\s*(begin|start\s+transaction|commit|end|abort|rollback(?!\s+(work\s+|transaction\s+)?to\b)|prepare\s+transaction)\b/i;

/** The client, whose query() refuses what would end the fenced transaction. */
function guarded(client) {
  const g = Object.create(client);
  g.query = (config, ...rest) => {
    const text = typeof config === 'string' ? config : config && config.text;
    if (typeof text === 'string' && ENDS_TRANSACTION.test(text)) {
      return Promise.reject(new Error(
        'fencedDb: the callback already runs in one fenced transaction; db.transaction() (or a '
        + 'BEGIN, COMMIT or ROLLBACK) would end it early. Use the db you were given; nested '
        + 'tx.transaction() savepoints are fine inside it.'));
    }
    return client.query(config, ...rest);
  };
  return g;
}

module.exports = { fencedDb };
