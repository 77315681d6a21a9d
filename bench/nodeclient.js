'use strict';
// A fenced one-row transaction through the Node package pg-fencing against the same transaction
// unfenced through node-postgres (issue 46), and against its floor (the same fenced() call and
// token on an unprotected table, the token stamped by the statement: no check). One connection,
// BENCH_ROUNDS rounds of BENCH_TXNS transactions of each variant, interleaved transaction by
// transaction, the median latency of a transaction per round, then the median over rounds. Run by bench/nodeclient.sh.
//   node bench/nodeclient.js --url URL [--out FILE]
const fs = require('node:fs');
const pg = require('pg');
const { fenced } = require('pg-fencing');

const args = process.argv.slice(2);
const arg = (name) => (args.includes(name) ? args[args.indexOf(name) + 1] : undefined);
const ROUNDS = Number(process.env.BENCH_ROUNDS || 7);
const TXNS = Number(process.env.BENCH_TXNS || 2000);

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

async function main() {
  const url = arg('--url');
  const admin = new pg.Client(url);
  await admin.connect();
  await admin.query('DROP TABLE IF EXISTS nb_fenced, nb_plain');
  await admin.query('CREATE TABLE nb_fenced (id int PRIMARY KEY, v int)');
  await admin.query('CREATE TABLE nb_plain (id int PRIMARY KEY, v int, fence_token bigint)');
  await admin.query("SELECT fencing_protect('nb_fenced', 'nodebench')");
  await admin.query("SELECT fencing_advance('nodebench', 5)");
  for (const t of ['nb_fenced', 'nb_plain']) {
    await admin.query(`BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO ${t} (id, v) SELECT g, 0 FROM generate_series(1, 1000) g; COMMIT`);
  }
  const c = new pg.Client(url);
  await c.connect();
  const variants = {
    fenced: (i) => fenced(c, 5n, (x) => x.query('UPDATE nb_fenced SET v = v + 1 WHERE id = $1', [(i % 1000) + 1])),
    floor: (i) => fenced(c, 5n, (x) => x.query('UPDATE nb_plain SET v = v + 1, fence_token = 5 WHERE id = $1', [(i % 1000) + 1])),
    unfenced: async (i) => {
      await c.query('BEGIN');
      await c.query('UPDATE nb_plain SET v = v + 1 WHERE id = $1', [(i % 1000) + 1]);
      await c.query('COMMIT');
    },
  };
  const names = Object.keys(variants);
  const results = Object.fromEntries(names.map((n) => [n, []]));
  // Interleaved transaction by transaction (the order rotating), so that the machine's drift
  // over a round weighs on every variant alike; each round's median per variant.
  for (let r = 0; r < ROUNDS; r += 1) {
    const lat = Object.fromEntries(names.map((n) => [n, []]));
    for (let i = 0; i < TXNS; i += 1) {
      for (let k = 0; k < names.length; k += 1) {
        const n = names[(i + k) % names.length];
        const t0 = process.hrtime.bigint();
        await variants[n](i);
        lat[n].push(Number(process.hrtime.bigint() - t0) / 1000);
      }
    }
    for (const n of names) results[n].push(median(lat[n]));
  }
  await c.end();
  await admin.end();
  const f = median(results.fenced);
  const fl = median(results.floor);
  const u = median(results.unfenced);
  const text = [
    `PostgreSQL 15, node-postgres ${require('pg/package.json').version} on Node ${process.versions.node}, one connection on loopback (fsync off); ${ROUNDS} rounds of ${TXNS} one-row UPDATE transactions of each variant, interleaved transaction by transaction; median latency per transaction.`,
    '',
    '| driver | fenced (µs) | floor (µs) | unfenced (µs) | fenced / floor | fenced / unfenced |',
    '|---|---:|---:|---:|---:|---:|',
    `| node-postgres | ${f.toFixed(0)} | ${fl.toFixed(0)} | ${u.toFixed(0)} | ${(f / fl).toFixed(3)} | ${(f / u).toFixed(3)} |`,
    '',
  ].join('\n');
  console.log(text);
  if (arg('--out')) fs.writeFileSync(arg('--out'), text);
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});
