// Sends one charge-order job and prints its id (examples/job-queues/README.md).
//
//   DATABASE_URL=postgres://... node enqueue.js '{"order": 7, "amount": 100, "work_seconds": 1}'
const { QUEUE, QUEUE_OPTIONS, newBoss } = require('./queue')

async function main () {
  const boss = newBoss()
  boss.on('error', err => console.error('pg-boss error:', err.message))
  await boss.start()
  await boss.createQueue(QUEUE, QUEUE_OPTIONS) // does nothing if it exists
  const id = await boss.send(QUEUE, JSON.parse(process.argv[2] || '{}'))
  console.log(id)
  await boss.stop()
}

main().catch(err => {
  console.error(err)
  process.exit(1)
})
