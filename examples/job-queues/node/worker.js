// A pg-boss worker whose job handler writes through pg_fencing with a PostgreSQL lease's token
// (examples/job-queues/README.md; run by tests/jobqueue/run.sh).
//
//   DATABASE_URL=postgres://... WORKER_NAME=A node worker.js
//
// pg-boss gives a job that outlived its expiry to another worker (queue.js). The handler takes a
// lease named after the job for as long as that expiry, so when pg-boss retries the job
// elsewhere the retry waits for the old lease to run out and gets a higher token; a protected
// table then refuses the first worker's late write (FT003: its lease was taken over; or FT001:
// a newer token already wrote the row), and the transaction is rolled back.
//
// It prints one line per step, for people and for the test:
//   worker=NAME ready
//   worker=NAME job=ID leased token=TOKEN
//   worker=NAME job=ID write ok result=TEXT
//   worker=NAME job=ID write refused SQLSTATE MESSAGE     (FT001/FT003: a zombie, fenced off)
//   worker=NAME job=ID write failed SQLSTATE MESSAGE      (anything else)
const os = require('node:os')
const { setTimeout: sleep } = require('node:timers/promises')
const { Pool } = require('pg')
const { fenced, fromError } = require('pg-fencing')
const { QUEUE, QUEUE_OPTIONS, newBoss } = require('./queue')

const WORKER = process.env.WORKER_NAME || `${os.hostname()}:${process.pid}`
const pool = new Pool({ connectionString: process.env.DATABASE_URL, max: 4 })

// The job's effect, keyed by the job: on a protected table (fencing_protect('results')) each row
// remembers the token of its last write, and the lease remembers whether a token is still live.
const UPSERT = `
  INSERT INTO results (job_id, order_id, amount, worker)
  VALUES ($1, $2, $3, $4)
  ON CONFLICT (job_id) DO UPDATE
     SET order_id = EXCLUDED.order_id, amount = EXCLUDED.amount, worker = EXCLUDED.worker`

const say = (job, text) => console.log(`worker=${WORKER} job=${job.id} ${text}`)

async function chargeOrder (job) {
  const order = job.data || {}
  // The lease lives as long as pg-boss lets this attempt run (the job's expireInSeconds), and a
  // retry waits up to that long for the previous attempt's lease to run out.
  const ttl = `${Number(job.expireInSeconds)} seconds`
  const client = await pool.connect()
  try {
    // One lease per job: a retry of this job (same id) asks for the same lease.
    // node-postgres returns bigint as a string; it goes back as one.
    const { rows: [{ token }] } = await client.query(
      'SELECT fencing_lease_acquire($1, $2::interval, $2::interval) AS token', [`job:${job.id}`, ttl])
    say(job, `leased token=${token}`)
    try {
      // The job's real work. A worker frozen here past the job's expiry is the zombie: pg-boss
      // has given the job to another worker.
      await sleep(Number(order.work_seconds || 0) * 1000)
      const amount = Number(order.amount || 0)
      try {
        // The token goes with the write, in the write's own transaction (pg-fencing sends BEGIN
        // and the token as one query, and rolls back if the write fails).
        await fenced(client, token, (c) => c.query(UPSERT, [job.id, Number(order.order || 0), amount, WORKER]))
      } catch (err) {
        // superseded: FT001 or FT003 (or FT006), another attempt owns the job now.
        const verdict = fromError(err)?.superseded ? 'refused' : 'failed'
        say(job, `write ${verdict} ${err.code} ${err.message}`)
        throw err // fenced off: stop; pg-boss records this (stale) attempt as failed
      }
      say(job, `write ok result=amount:${amount}`)
    } finally {
      // false when the lease is no longer ours; nothing to do then.
      await client.query('SELECT fencing_lease_release($1)', [token])
    }
  } finally {
    client.release()
  }
}

async function main () {
  const boss = newBoss()
  boss.on('error', err => console.error(`worker=${WORKER} pg-boss error: ${err.message}`))
  await boss.start()
  await boss.createQueue(QUEUE, QUEUE_OPTIONS) // does nothing if it exists
  // pg-boss 10 hands the handler an array of jobs (batchSize of them at most).
  await boss.work(QUEUE, { batchSize: 1, pollingIntervalSeconds: 0.5 }, async ([job]) => chargeOrder(job))
  console.log(`worker=${WORKER} ready`)
  for (const signal of ['SIGINT', 'SIGTERM']) {
    process.once(signal, async () => {
      await boss.stop({ graceful: false })
      await pool.end()
      process.exit(0)
    })
  }
}

main().catch(err => {
  console.error(err)
  process.exit(1)
})
