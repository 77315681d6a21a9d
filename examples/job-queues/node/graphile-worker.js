// A graphile-worker worker whose task writes through pg_fencing with a PostgreSQL lease's token
// (examples/job-queues/README.md; run by tests/jobqueue/run.sh).
//
//   DATABASE_URL=postgres://... npx graphile-worker --schema-only      # once per database
//   DATABASE_URL=postgres://... WORKER_NAME=A node graphile-worker.js
//   psql "$DATABASE_URL" -c "SELECT graphile_worker.add_job('charge_order',
//       '{\"order\": 7, \"amount\": 100, \"work_seconds\": 1, \"finish_seconds\": 2}')"
//
// graphile-worker locks a job for the worker that runs it and takes the lock back only after 4
// hours (or when an operator, sure that the worker is dead, calls forceUnlockWorkers), and has no
// heartbeat of its own. So the lease cannot follow the queue's expiry: the task takes a short
// lease named after the job (JOB_LEASE_TTL seconds, default 2 here; real jobs: tens of seconds)
// and renews it every third of its TTL, on a connection of its own, while it works. A worker that
// freezes (a GC pause, SIGSTOP, a VM migration) stops renewing, and its lease runs out within the
// TTL: when the job is handed to another worker (the 4 h expiry, or forceUnlockWorkers), that
// worker's lease request waits at most the TTL and gets a higher token, and a protected table
// refuses the frozen worker's late write (FT003: its lease was taken over; or FT001: a newer token
// already wrote the row).
//
// A task fenced off throws. graphile-worker records a failure only for a job this worker still
// has locked, so the failure lands where nobody took the job over (it is then retried) and
// nowhere else; returning normally would instead complete (delete) the job, whoever runs it now.
//
// It prints one line per step, for people and for the test:
//   worker=NAME ready
//   worker=NAME job=ID leased token=TOKEN locked_by=WORKER_ID
//   worker=NAME job=ID write ok result=TEXT
//   worker=NAME job=ID write refused SQLSTATE MESSAGE     (FT001/FT003: a zombie, fenced off)
//   worker=NAME job=ID write failed SQLSTATE MESSAGE      (anything else)
//   worker=NAME job=ID renew refused SQLSTATE MESSAGE     (the lease had ended)
//   worker=NAME job=ID done
const os = require('node:os')
const { setTimeout: sleep } = require('node:timers/promises')
const { Pool } = require('pg')
const { fenced, fromError } = require('pg-fencing')
const { run } = require('graphile-worker')

const WORKER = process.env.WORKER_NAME || `${os.hostname()}:${process.pid}`
const LEASE_TTL = Number(process.env.JOB_LEASE_TTL || 2) // seconds
const pool = new Pool({ connectionString: process.env.DATABASE_URL, max: 8 })

// The job's effect, keyed by the job: on a protected table (fencing_protect('results')) each row
// remembers the token of its last write, and the lease remembers whether a token is still live.
const UPSERT = `
  INSERT INTO results (job_id, order_id, amount, worker)
  VALUES ($1, $2, $3, $4)
  ON CONFLICT (job_id) DO UPDATE
     SET order_id = EXCLUDED.order_id, amount = EXCLUDED.amount, worker = EXCLUDED.worker`

const say = (job, text) => console.log(`worker=${WORKER} job=${job.id} ${text}`)

// The lease's heartbeat: every third of the TTL, on its own connection (a long statement of the
// task never delays it); stops at the first refusal, when the lease has ended.
function renewEvery (job, token, client) {
  const timer = setInterval(() => {
    client.query('SELECT fencing_lease_renew($1)', [token]).catch(err => {
      clearInterval(timer)
      say(job, `renew refused ${err.code} ${err.message}`)
    })
  }, (LEASE_TTL * 1000) / 3)
  return timer
}

async function chargeOrder (payload, { job }) {
  const client = await pool.connect()
  const renewer = await pool.connect()
  let timer
  try {
    // One lease per job: a run of this job on another worker asks for the same lease, waits up
    // to the TTL for this one to run out, and gets a higher token. node-postgres returns bigint
    // as a string; it goes back as one.
    const ttl = `${LEASE_TTL} seconds`
    const { rows: [{ token }] } = await client.query(
      'SELECT fencing_lease_acquire($1, $2::interval, $2::interval) AS token', [`job:${job.id}`, ttl])
    say(job, `leased token=${token} locked_by=${job.locked_by}`)
    timer = renewEvery(job, token, renewer)
    try {
      // The job's real work. A worker frozen here is the zombie once the job is handed on.
      await sleep(Number(payload.work_seconds || 0) * 1000)
      const amount = Number(payload.amount || 0)
      try {
        // The token goes with the write, in the write's own transaction (pg-fencing sends BEGIN
        // and the token as one query, and rolls back if the write fails).
        await fenced(client, token, (c) => c.query(UPSERT, [job.id, Number(payload.order || 0), amount, WORKER]))
      } catch (err) {
        // superseded: FT001 or FT003 (or FT006), another attempt owns the job now.
        const verdict = fromError(err)?.superseded ? 'refused' : 'failed'
        say(job, `write ${verdict} ${err.code} ${err.message}`)
        // Fenced off: stop, and throw (never return: that would complete the job, whoever runs
        // it now). graphile-worker records the failure only if the job is still locked by us.
        throw err
      }
      say(job, `write ok result=amount:${amount}`)
      // The rest of the job (a receipt, a notification) before it ends.
      await sleep(Number(payload.finish_seconds || 0) * 1000)
    } finally {
      clearInterval(timer)
      // false when the lease is no longer ours; nothing to do then.
      await client.query('SELECT fencing_lease_release($1)', [token])
    }
    say(job, 'done')
  } finally {
    client.release()
    renewer.release()
  }
}

async function main () {
  const runner = await run({
    connectionString: process.env.DATABASE_URL,
    concurrency: 1,
    pollInterval: 500, // ms: how soon a job unlocked by forceUnlockWorkers is seen
    noHandleSignals: true,
    parsedCronItems: [], // no recurring tasks (else it looks for a crontab file)
    taskList: { charge_order: chargeOrder }
  })
  console.log(`worker=${WORKER} ready`)
  for (const signal of ['SIGINT', 'SIGTERM']) {
    process.once(signal, async () => {
      await runner.stop()
      await pool.end()
      process.exit(0)
    })
  }
  await runner.promise
}

main().catch(err => {
  console.error(err)
  process.exit(1)
})
