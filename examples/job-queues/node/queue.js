// The queue's settings, shared by worker.js and enqueue.js (examples/job-queues/README.md).
//
// pg-boss fails an active job whose handler has run longer than its queue's expireInSeconds
// (the maintenance of any running pg-boss instance does it, every maintenanceIntervalSeconds)
// and, while retryLimit allows, puts it back for another worker: the same job id, retry_count
// + 1. The worker it was taken from may still be alive (a GC pause, SIGSTOP, a VM migration):
// worker.js's handler therefore writes with the token of a PostgreSQL lease whose TTL is the
// job's expiry, so a protected table refuses that worker's late write.
const PgBoss = require('pg-boss')

const QUEUE = 'charge-order'

// Short on purpose (the test freezes a worker past it); real jobs use minutes.
const QUEUE_OPTIONS = {
  expireInSeconds: Number(process.env.JOB_EXPIRE_SECONDS || 3),
  retryLimit: 2,
  retryDelay: 0
}

function newBoss () {
  // DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/app
  return new PgBoss({
    connectionString: process.env.DATABASE_URL,
    // How often this instance looks for expired jobs (pg-boss 10's minimum is 1 s).
    maintenanceIntervalSeconds: 1
  })
}

module.exports = { QUEUE, QUEUE_OPTIONS, newBoss }
