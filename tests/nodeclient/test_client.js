'use strict';
// Tests of the Node package pg-fencing (clients/node), installed from its `npm pack` tarball by
// tests/nodeclient/run.sh into node_modules/pg-fencing, against a real server with pg_fencing
// preloaded and log_statement = all (a fenced transaction's statements are counted from the
// server's log).
//   node tests/nodeclient/test_client.js --url URL --log FILE
const fs = require('node:fs');
const path = require('node:path');
const pg = require('pg');
const pf = require('pg-fencing');
const { fencedDb } = require('pg-fencing/drizzle');
const { pgTable, integer, bigint } = require('drizzle-orm/pg-core');
const { eq, sql } = require('drizzle-orm');

const args = process.argv.slice(2);
const arg = (name) => args[args.indexOf(name) + 1];
const URL_ = arg('--url');
const LOG = arg('--log');
const FAILS = [];

function check(what, cond, got) {
  console.log(`  ${cond ? 'ok' : 'FAIL'}: ${what}${cond ? '' : ` (got ${String(got)})`}`);
  if (!cond) FAILS.push(what);
}

/** `fn` rejects with an instance of `Cls` whose fields equal `fields`; returns the error. */
async function rejects(what, Cls, fn, fields = {}) {
  try {
    await fn();
  } catch (e) {
    if (!(e instanceof Cls)) {
      check(what, false, `${e && e.constructor && e.constructor.name}: ${e && e.message}`);
      return e;
    }
    const bad = Object.entries(fields).filter(([k, v]) => e[k] !== v);
    check(what, bad.length === 0, JSON.stringify(bad.map(([k]) => [k, String(e[k])])));
    return e;
  }
  check(what, false, 'no error');
  return undefined;
}

function statements(app) {
  return fs
    .readFileSync(LOG, 'utf8')
    .split('\n')
    .filter((l) => l.includes(`[${app}]`) && (l.includes('LOG:  statement:') || l.includes('LOG:  execute')));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * The statement that carries the token on one client (a Client, then a Pool's client): the first
 * fenced transaction asks (the probe), the next ones use its answer: set_config where
 * pg_stat_statements is loaded (PostgreSQL 15 here), SET LOCAL where it is not. Either way a stale
 * token is refused and the client's next transaction has no token.
 */
async function tokenForms(admin, pgss) {
  const suffix = pgss ? 'pgss' : 'nopgss';
  console.log(`-- the token's statement, ${pgss ? 'with' : 'without'} pg_stat_statements`);
  const resource = `jsforms_${suffix}`;
  await admin.query('CREATE TABLE jsforms (id int PRIMARY KEY, v int)');
  await admin.query('SELECT fencing_protect($1, $2)', ['jsforms', resource]);
  await admin.query('SELECT fencing_advance($1, 10)', [resource]);
  await admin.query("BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO jsforms VALUES (1, 0); COMMIT");
  const last = {};
  const kinds = [
    ['client', async (app) => { const c = new pg.Client({ connectionString: URL_, application_name: app }); await c.connect(); return [c, () => c.end()]; }],
    ['pool', async (app) => { const p = new pg.Pool({ connectionString: URL_, max: 1, application_name: app }); return [p, () => p.end()]; }],
  ];
  let base = 10;
  for (const [kind, open] of kinds) {
    const app = `pffjs_${kind}_${suffix}`;
    const [target, close] = await open(app);
    for (const tok of [base, base + 1]) {
      await pf.fenced(target, tok, (c) => c.query('UPDATE jsforms SET v = v + 1 WHERE id = 1'));
    }
    last[app] = base + 1;
    await rejects(`${kind}: a stale token in the second form is refused`, pf.StaleToken,
      () => pf.fenced(target, base - 1, (c) => c.query('UPDATE jsforms SET v = v + 100 WHERE id = 1')), { token: BigInt(base - 1) });
    try {
      await target.query('UPDATE jsforms SET v = v + 100 WHERE id = 1');
      check(`${kind}: the next statement carries no token`, false, 'committed');
    } catch (e) {
      check(`${kind}: the next statement carries no token (NoToken)`, pf.fromError(e) instanceof pf.NoToken, e.code);
    }
    await close();
    base += 2;
  }
  const v = (await admin.query('SELECT v FROM jsforms WHERE id = 1')).rows[0].v;
  check(`nothing stale or tokenless was written (v = ${v})`, v === 4, v);
  await sleep(300);
  // PostgreSQL 16 and later normalise a SET's constants: the probe answers SET LOCAL there too.
  const v16 = Number((await admin.query('SHOW server_version_num')).rows[0].server_version_num) >= 160000;
  for (const [app, t] of Object.entries(last)) {
    const want = pgss && !v16 ? `SELECT pg_catalog.set_config('pg_fencing.token', '${t}', true)` : `SET LOCAL pg_fencing.token = '${t}'`;
    const begins = statements(app).filter((l) => l.includes('statement: BEGIN;'));
    check(`${app}: the first transaction asks, the second sends \`${want}\``,
      begins.length >= 2 && begins[0].includes('UNION ALL SELECT NULL WHERE') && begins[1].trimEnd().endsWith(`BEGIN; ${want}`),
      JSON.stringify(begins.slice(0, 2)));
  }
  await admin.query('SELECT fencing_unprotect($1)', ['jsforms']);
  await admin.query('DROP TABLE jsforms');
}

/**
 * One client shared by two fenced() calls at once, a pool's client released inside fn: never a
 * write with another call's token, never a borrower inside the fenced transaction.
 */
async function sharing(admin) {
  console.log('-- one client, two fenced() at once; a pool client released inside fn');
  await admin.query('CREATE TABLE jsshared (id int PRIMARY KEY, v int)');
  await admin.query("SELECT fencing_protect('jsshared', 'jsshared')");
  await admin.query("SELECT fencing_advance('jsshared', 11)");
  await admin.query("BEGIN; SET LOCAL pg_fencing.token = '11'; INSERT INTO jsshared VALUES (1, 0), (2, 0); COMMIT");
  const c = new pg.Client(URL_);
  await c.connect();
  const outcome = async (p) => p.then(() => 'ok', (e) => (e && e.constructor && e.constructor.name) || String(e));
  const [stale, holder] = await Promise.all([
    outcome(pf.fenced(c, 10n, (x) => x.query('UPDATE jsshared SET v = 100 WHERE id = 1'))),
    outcome(pf.fenced(c, 11n, (x) => x.query('UPDATE jsshared SET v = 1 WHERE id = 2'))),
  ]);
  check(`a second fenced() on a client in use is refused (${stale}, ${holder})`,
    holder === 'Error' && (stale === 'StaleToken' || stale === 'ok'), [stale, holder]);
  const v1 = (await admin.query('SELECT v FROM jsshared WHERE id = 1')).rows[0].v;
  check(`… the stale call's write never commits with the other call's token (v = ${v1})`, v1 === 0, v1);
  await c.end();
  const pool = new pg.Pool({ connectionString: URL_, max: 1 });
  const got = await outcome(pf.fenced(pool, 11n, async (x) => {
    await x.query('UPDATE jsshared SET v = 50 WHERE id = 2');
    x.release();
  }));
  check(`releasing the pool's client inside fn is refused (${got})`, got === 'Error', got);
  const next = await pool.connect();
  try {
    const st = (await next.query("SELECT current_setting('pg_fencing.token') AS t, (SELECT v FROM jsshared WHERE id = 2) AS v")).rows[0];
    check(`… the next borrower has no token and sees nothing of it (${JSON.stringify(st)})`, st.t === '' && st.v !== 50, JSON.stringify(st));
  } finally {
    next.release();
  }
  await pool.end();
  await admin.query("SELECT fencing_unprotect('jsshared')");
  await admin.query('DROP TABLE jsshared');
}

async function main() {
  const installed = require.resolve('pg-fencing');
  check(`pg-fencing is the installed package, not the checkout (${path.relative(process.cwd(), installed)})`,
    installed.includes(`${path.sep}node_modules${path.sep}pg-fencing${path.sep}`), installed);
  const admin = new pg.Client(URL_);
  await admin.connect();
  if (args.includes('--set-local-only')) {
    await tokenForms(admin, false);
    await admin.end();
    console.log(`node client (without pg_stat_statements): ${FAILS.length ? 'FAILED' : 'all checks passed'}`);
    process.exitCode = FAILS.length ? 1 : 0;
    return;
  }
  await tokenForms(admin, true);
  await sharing(admin);
  const one = async (q, p) => (await admin.query(q, p)).rows[0];
  await admin.query('CREATE TABLE acct (id int PRIMARY KEY, v int)');
  await admin.query("SELECT fencing_protect('acct', 'js')");
  await admin.query("SELECT fencing_advance('js', 10)");
  await admin.query('CREATE TABLE plain (id int PRIMARY KEY, v int)');
  await admin.query('INSERT INTO plain VALUES (1, 0)');

  console.log('-- tokens');
  check('a BigInt, a safe integer and a string of digits are tokens',
    pf.checkToken(10n) === 10n && pf.checkToken(10) === 10n && pf.checkToken('10') === 10n);
  for (const [what, bad, Cls] of [
    ['a string that is not digits', '10; DROP TABLE acct', TypeError],
    ['a Number beyond 2^53', 2 ** 60, TypeError],
    ['a fraction', 1.5, TypeError],
    ['null', null, TypeError],
    ['0', 0n, RangeError],
    ['2^63', 1n << 63n, RangeError],
    ['-1', -1, RangeError],
  ]) {
    let e;
    try {
      pf.checkToken(bad);
    } catch (err) {
      e = err;
    }
    check(`${what} is refused (${Cls.name})`, e instanceof Cls, e);
  }

  console.log('-- node-postgres: a client');
  const conn = new pg.Client({ connectionString: URL_, application_name: 'pfjs_client' });
  await conn.connect();
  const r = await pf.fenced(conn, 10n, async (c) => {
    await c.query('INSERT INTO acct VALUES (1, 1)');
    return 'done';
  });
  check('a fenced transaction commits and returns fn\'s value', r === 'done');
  check('the row is stamped with its token', Number((await one('SELECT fence_token FROM acct WHERE id = 1')).fence_token) === 10);
  const stale = await rejects('a stale token: StaleToken with the resource and numbers', pf.StaleToken,
    () => pf.fenced(conn, '9', (c) => c.query('UPDATE acct SET v = 2 WHERE id = 1')),
    { code: 'FT001', token: 9n, highWater: 10n, resource: 'js', superseded: true });
  check("StaleToken's cause is node-postgres's DatabaseError", stale && stale.cause instanceof pg.DatabaseError, stale && stale.cause);
  check('the refused transaction left nothing', (await one('SELECT v FROM acct WHERE id = 1')).v === 1);
  check('the connection is idle again', conn.getTransactionStatus() === 'I', conn.getTransactionStatus());
  await rejects('the same connection after a fenced transaction carries no token (NoToken)', pf.NoToken, async () => {
    try {
      await conn.query('UPDATE acct SET v = 3 WHERE id = 1');
    } catch (e) {
      throw pf.fromError(e) || e;
    }
  }, { code: 'FT002', superseded: false });
  class HandlerFailed extends Error {}
  await rejects('an error in fn rolls back and propagates unchanged', HandlerFailed, () =>
    pf.fenced(conn, 10, async (c) => {
      await c.query('UPDATE acct SET v = 4 WHERE id = 1');
      throw new HandlerFailed('the handler failed');
    }));
  check('… nothing committed', (await one('SELECT v FROM acct WHERE id = 1')).v === 1);
  await conn.query('BEGIN');
  await rejects('fenced() on a connection already in a transaction is refused', Error, () =>
    pf.fenced(conn, 10, (c) => c.query('UPDATE acct SET v = 5 WHERE id = 1')));
  check('… and the caller\'s transaction is left as it was', conn.getTransactionStatus() === 'T', conn.getTransactionStatus());
  await conn.query('ROLLBACK');
  await rejects('a bad token is refused before anything is sent', TypeError, () =>
    pf.fenced(conn, "10'; RESET pg_fencing.token; --", (c) => c.query('UPDATE acct SET v = 5 WHERE id = 1')));
  await conn.end();

  console.log('-- round trips: a fenced transaction sends as many statements as an unfenced one');
  const fc = new pg.Client({ connectionString: URL_, application_name: 'pfjs_rt_fenced' });
  const uc = new pg.Client({ connectionString: URL_, application_name: 'pfjs_rt_plain' });
  await fc.connect();
  await uc.connect();
  await pf.fenced(fc, 10, (c) => c.query('UPDATE acct SET v = v + 1 WHERE id = $1', [1]));
  await uc.query('BEGIN');
  await uc.query('UPDATE plain SET v = v + 1 WHERE id = $1', [1]);
  await uc.query('COMMIT');
  await fc.end();
  await uc.end();
  await sleep(300);
  const nf = statements('pfjs_rt_fenced').length;
  const nu = statements('pfjs_rt_plain').length;
  check(`node-postgres: ${nf} statements fenced, ${nu} unfenced`, nf === nu && nf > 0, [nf, nu]);

  console.log('-- pg_stat_statements: one entry whatever the token');
  await admin.query('SELECT pg_stat_statements_reset()');
  const sp = new pg.Pool({ connectionString: URL_, max: 1 });
  for (const tok of [4242424201n, 4242424202n, 4242424203n]) {
    await pf.fenced(sp, tok, (c) => c.query('SELECT 1'));
  }
  await sp.end();
  const perToken = (await admin.query("SELECT query FROM pg_stat_statements WHERE query ~ '42424242'")).rows;
  check(`no pg_stat_statements entry carries a token (${perToken.length} do)`, perToken.length === 0, JSON.stringify(perToken));

  console.log('-- pg.Pool: the next borrower never carries the token');
  const pool = new pg.Pool({ connectionString: URL_, max: 1 });
  await pf.fenced(pool, 10, (c) => c.query('UPDATE acct SET v = v + 1 WHERE id = 1'));
  check('the pool got its client back', pool.idleCount === 1 && pool.totalCount === 1, [pool.idleCount, pool.totalCount]);
  const c2 = await pool.connect();
  try {
    await c2.query('UPDATE acct SET v = v + 1 WHERE id = 1');
    check('the next borrower\'s write without a token is refused', false, 'committed');
  } catch (e) {
    check('the next borrower\'s write without a token is refused (NoToken)', pf.fromError(e) instanceof pf.NoToken, e.code);
  } finally {
    c2.release();
  }
  await rejects('a stale token through the pool: StaleToken', pf.StaleToken,
    () => pf.fenced(pool, 3, (c) => c.query('UPDATE acct SET v = 0 WHERE id = 1')), { token: 3n });
  check('… the pool got its client back after the refusal', pool.idleCount === 1, pool.idleCount);

  console.log('-- typed errors for every SQLSTATE');
  for (const [code, Cls] of [['FT001', pf.StaleToken], ['FT002', pf.NoToken], ['FT003', pf.LeaseLost],
    ['FT004', pf.ProtectionInactive], ['FT005', pf.LockServiceUnavailable], ['FT006', pf.NotCurrentHolder]]) {
    try {
      await admin.query(`DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '${code}'; END $$`);
      check(`${code} raised`, false, 'no error');
    } catch (e) {
      const t = pf.fromError(e);
      check(`${code} → ${Cls.name}`, t instanceof Cls && t.constructor === Cls && t.code === code && t instanceof pf.FencingError, t);
    }
  }
  try {
    await admin.query('SELECT 1/0');
  } catch (e) {
    check('another SQLSTATE is not a fencing error', pf.fromError(e) === undefined, pf.fromError(e));
  }
  await rejects('fenced_update of a table that is not protected: ProtectionInactive', pf.ProtectionInactive,
    () => pf.fenced(pool, 10, (c) => c.query(`SELECT fenced_update('plain', '{"id": 1}', '{"v": 5}', 10)`)), { code: 'FT004' });

  console.log('-- per-row mode: the row in the error');
  await admin.query('CREATE TABLE rows_t (id int PRIMARY KEY, v int)');
  await admin.query("SELECT fencing_protect('rows_t')");
  await pf.fenced(pool, 50, (c) => c.query('INSERT INTO rows_t VALUES (7, 1)'));
  const rowErr = await rejects('a stale token on a row: StaleToken with the row and table', pf.StaleToken,
    () => pf.fenced(pool, 40, (c) => c.query('UPDATE rows_t SET v = 2 WHERE id = 7')), { token: 40n, highWater: 50n });
  check(`… the row and its table are parsed (${rowErr && rowErr.row}, ${rowErr && rowErr.table})`,
    rowErr && rowErr.row !== undefined && /7/.test(rowErr.row) && /rows_t/.test(rowErr.table || ''), rowErr && rowErr.message);

  console.log('-- Drizzle ORM');
  const acct = pgTable('acct', { id: integer('id').primaryKey(), v: integer('v'), fenceToken: bigint('fence_token', { mode: 'bigint' }) });
  await admin.query("SELECT fencing_advance('js', 20)");
  const rows = await fencedDb(pool, 20n, async (db) => {
    await db.update(acct).set({ v: 21 }).where(eq(acct.id, 1));
    return db.select().from(acct).where(eq(acct.id, 1));
  });
  check('a Drizzle update in a fenced transaction commits, stamped', rows[0].v === 21 && rows[0].fenceToken === 20n, JSON.stringify(rows, (k, v) => (typeof v === 'bigint' ? String(v) : v)));
  await rejects('Drizzle with a stale token: StaleToken', pf.StaleToken, () =>
    fencedDb(pool, 19n, (db) => db.update(acct).set({ v: 22 }).where(eq(acct.id, 1))), { token: 19n, highWater: 20n });
  const drizzleBefore = (await one('SELECT v FROM acct WHERE id = 1')).v;
  await rejects('db.transaction() inside fencedDb is refused (it would end the fenced transaction early)', Error, () =>
    fencedDb(pool, 20n, async (db) => {
      await db.transaction((tx) => tx.update(acct).set({ v: 6 }).where(eq(acct.id, 1)));
      await db.update(acct).set({ v: 7 }).where(eq(acct.id, 1));
    }));
  check('… and nothing of that block committed', (await one('SELECT v FROM acct WHERE id = 1')).v === drizzleBefore);
  const tokenInside = await fencedDb(pool, 20n, (db) => db.execute(sql`SELECT current_setting('pg_fencing.token') AS t`));
  check('the token is set inside the Drizzle transaction', tokenInside.rows[0].t === '20', tokenInside.rows[0].t);
  check('… and the pool\'s client came back', pool.idleCount === 1, pool.idleCount);

  console.log('-- a failed statement whose error fn caught: RolledBack, nothing committed');
  const before = (await one('SELECT v FROM acct WHERE id = 1')).v;
  await rejects('fenced() rejects with RolledBack', pf.RolledBack, () => pf.fenced(pool, 20, async (c) => {
    await c.query('UPDATE acct SET v = v + 1 WHERE id = 1');
    try {
      await c.query('SELECT 1/0');
    } catch (e) { /* swallowed, as an "insert or ignore" helper would */ }
    return 'done';
  }));
  check('… nothing committed, the pool\'s client back', (await one('SELECT v FROM acct WHERE id = 1')).v === before && pool.idleCount === 1);

  console.log('-- fn ends the fenced transaction itself (ROLLBACK or COMMIT): never reported as committed');
  // The same on a Client whose node-postgres does not tell the transaction status (before 8.11):
  // getTransactionStatus shadowed on it.
  const noStatus = new pg.Client(URL_);
  await noStatus.connect();
  noStatus.getTransactionStatus = undefined;
  for (const [kind, target] of [['pool', pool], ['a client without getTransactionStatus', noStatus]]) {
    for (const end of ['ROLLBACK', 'COMMIT']) {
      const b = (await one('SELECT v FROM acct WHERE id = 1')).v;
      const e = await rejects(`${kind}: fn ran ${end}: an Error, not success`, Error, () => pf.fenced(target, 20, async (c) => {
        await c.query('UPDATE acct SET v = v + 1 WHERE id = 1');
        await c.query(end);
        return 'done';
      }));
      check("… its message says 'ended the fenced transaction'", e && /ended the fenced transaction/.test(e.message) && !(e instanceof pf.RolledBack), e && e.message);
      if (end === 'ROLLBACK') check('… nothing committed', (await one('SELECT v FROM acct WHERE id = 1')).v === b);
    }
    check(`${kind}: usable afterwards, out of any transaction`, (await (kind === 'pool' ? pool : noStatus).query('SELECT 1 AS x')).rows[0].x === 1
      && (kind !== 'pool' || pool.idleCount === 1));
  }
  const nb = (await one('SELECT v FROM acct WHERE id = 1')).v;
  await rejects('a client without getTransactionStatus: a failed statement whose error fn caught: RolledBack', pf.RolledBack,
    () => pf.fenced(noStatus, 20, async (c) => {
      await c.query('UPDATE acct SET v = v + 1 WHERE id = 1');
      try {
        await c.query('SELECT 1/0');
      } catch (e) { /* swallowed */ }
    }));
  check('… nothing committed', (await one('SELECT v FROM acct WHERE id = 1')).v === nb);
  await pf.fenced(noStatus, 20, (c) => c.query('UPDATE acct SET v = v + 1 WHERE id = 1'));
  check('a client without getTransactionStatus: a fenced transaction commits', (await one('SELECT v FROM acct WHERE id = 1')).v === nb + 1);
  await noStatus.query('UPDATE acct SET v = v + 1 WHERE id = 1').then(
    () => check('… and its client carries no token afterwards', false, 'committed'),
    (e) => check('… and its client carries no token afterwards (NoToken)', pf.fromError(e) instanceof pf.NoToken, e));
  await noStatus.end();
  await rejects('Drizzle: a ROLLBACK inside fencedDb is refused', Error, () =>
    fencedDb(pool, 20n, (db) => db.execute(sql`ROLLBACK`)));

  console.log('-- typed errors: names with quotes, spaces and newlines');
  for (const name of ['quo"te', 'two""quotes', 'x" of table y', 'new\nline']) {
    await admin.query('SELECT fencing_advance($1, 5)', [name]);
    try {
      await admin.query('SELECT fencing_advance($1, 4)', [name]);
      check(`resource ${JSON.stringify(name)}: refused`, false, 'accepted');
    } catch (e) {
      const t = pf.fromError(e);
      check(`resource ${JSON.stringify(name)}: parsed exactly`, t && t.resource === name && t.token === 4n && t.highWater === 5n,
        t && JSON.stringify([t.resource, String(t.token), String(t.highWater)]));
    }
  }

  console.log('-- a PostgreSQL lease');
  const lease = await pf.Lease.acquire(URL_, 'js-lease', { ttlMs: 1200 });
  check('the lease has a BigInt token', typeof lease.token === 'bigint' && lease.token > 0n, lease.token);
  await admin.query("SELECT fencing_advance('js', $1)", [lease.token.toString()]);
  await sleep(2000);
  check('renewed past its TTL, it is not lost', !lease.lost, lease.error);
  await pf.fenced(pool, lease.token, async (c) => {
    lease.check();
    await c.query('UPDATE acct SET v = 8 WHERE id = 1');
  });
  check('a write with the live lease\'s token', (await one('SELECT v FROM acct WHERE id = 1')).v === 8);
  const aborted = new Promise((resolve) => lease.signal.addEventListener('abort', () => resolve(lease.signal.reason)));
  await admin.query('SELECT pg_terminate_backend($1)', [lease.backendPid]);
  const reason = await Promise.race([aborted, sleep(3000).then(() => undefined)]);
  check('a lease whose renewal fails aborts its signal with LeaseLost', reason instanceof pf.LeaseLost, reason);
  await rejects('lease.check() throws LeaseLost', pf.LeaseLost, async () => lease.check(), { superseded: true });
  check('release() of a lost lease is false', (await lease.release()) === false);
  await sleep(1300);
  await rejects('the lost lease\'s token, expired, is refused by the server (LeaseLost)', pf.LeaseLost, () =>
    pf.fenced(pool, lease.token, (c) => c.query('UPDATE acct SET v = 9 WHERE id = 1')), { code: 'FT003' });

  const held = await pf.Lease.acquire(URL_, 'js-held', { ttlMs: 5000 });
  await rejects('a lease already held, without waiting: the server\'s 55P03', Error, () =>
    pf.Lease.acquire(URL_, 'js-held', { ttlMs: 5000 }), { code: '55P03' });
  check('release() of a live lease is true', (await held.release()) === true);

  console.log('-- a lease whose renewals stall (its connection frozen) is lost at its TTL');
  const st = await pf.Lease.acquire(URL_, 'js-stall', { ttlMs: 1200 });
  const stPid = (await one("SELECT holder_pid AS p FROM fencing_leases WHERE name = 'js-stall'")).p;
  await sleep(200);
  process.kill(stPid, 'SIGSTOP');
  try {
    const reason = await Promise.race([
      new Promise((r) => {
        if (st.signal.aborted) r(st.signal.reason);
        st.signal.addEventListener('abort', () => r(st.signal.reason));
      }),
      sleep(3000)]);
    check('its signal is aborted with LeaseLost once the TTL passed without a renewal', reason instanceof pf.LeaseLost, reason);
    await rejects('lease.check() throws LeaseLost', pf.LeaseLost, async () => st.check());
    const t0 = Date.now();
    const released = await st.release();
    check(`release() does not wait for the stalled renewal (${Date.now() - t0} ms, ${released})`, Date.now() - t0 < 1500 && released === false);
  } finally {
    process.kill(stPid, 'SIGCONT');
  }
  const jb = (await one('SELECT v FROM acct WHERE id = 1')).v;
  await rejects('runWithLease whose lease stalled past its TTL rejects with LeaseLost', pf.LeaseLost, () =>
    pf.runWithLease(pool, 'js-stalljob', async (c) => {
      await c.query('UPDATE acct SET v = 77 WHERE id = 1');
      const p = (await one("SELECT holder_pid AS p FROM fencing_leases WHERE name = 'js-stalljob'")).p;
      process.kill(p, 'SIGSTOP');
      await sleep(1500);
      process.kill(p, 'SIGCONT');
      return 'done';
    }, { ttlMs: 1000, leaseConfig: URL_ }));
  check('… and its write was not committed', (await one('SELECT v FROM acct WHERE id = 1')).v === jb);

  console.log('-- runWithLease: a lease lost mid-job stops the handler before its write commits');
  await rejects('runWithLease rejects with LeaseLost', pf.LeaseLost, () =>
    pf.runWithLease(pool, 'js-job', async (c, l) => {
      await c.query('UPDATE acct SET v = 10 WHERE id = 1');
      await admin.query('SELECT pg_terminate_backend($1)', [l.backendPid]);
      await sleep(1000);
      return 'done';
    }, { ttlMs: 900, leaseConfig: URL_ }));
  check('… and its write was not committed', (await one('SELECT v FROM acct WHERE id = 1')).v === 8);
  check('… and the pool got its client back', pool.idleCount === 1, pool.idleCount);
  const adv = await pf.runWithLease(pool, 'js-job2', async (c) =>
    (await c.query("SELECT fencing_advance('js', current_setting('pg_fencing.token')::bigint) AS m")).rows[0].m,
  { ttlMs: 5000, leaseConfig: URL_ });
  check('runWithLease resolves to fn\'s value', typeof adv === 'string' && BigInt(adv) > 0n, adv);
  check('… and released its lease', (await one("SELECT count(*)::int AS n FROM fencing_leases WHERE name = 'js-job2' AND live")).n === 0);

  await pool.end();
  await admin.end();
  console.log(`node client: ${FAILS.length ? `${FAILS.length} checks FAILED` : 'all checks passed'}`);
  process.exitCode = FAILS.length ? 1 : 0;
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 2;
});
