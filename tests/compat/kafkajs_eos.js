// KafkaJS 2.2.4, unmodified, against the Kafka ports (tests/compat/test_kafkajs.py).
//   node kafkajs_eos.js setup BROKERS INPUT OUTPUT COUNT
//     creates INPUT and OUTPUT with 3 partitions, sends ids 0..COUNT-1 to INPUT (plain producer)
//   node kafkajs_eos.js copy BROKERS INPUT OUTPUT GROUP TRANSACTIONAL_ID
//     the exactly-once consume-transform-produce loop of the KafkaJS docs: one
//     transaction per batch (send, sendOffsets, commit); prints "committed N" after each
//     commit and exits 0 once the group's committed offsets reach INPUT's end.
//   node kafkajs_eos.js read BROKERS TOPIC COUNT
//     reads TOPIC read_committed from the beginning in a fresh group until COUNT values
//     arrived and three more fetches followed; prints each value on its own line.
'use strict'
const { Kafka, logLevel } = require('kafkajs')

const [mode, brokers, input, output, ...rest] = process.argv.slice(2)
const kafka = new Kafka({ clientId: 'kafkajs-eos', brokers: brokers.split(','), logLevel: logLevel.WARN,
                          retry: { retries: 20, initialRetryTime: 200, maxRetryTime: 3000 } })

async function setup (count) {
  const admin = kafka.admin()
  await admin.connect()
  await admin.createTopics({ waitForLeaders: true, topics: [input, output].map(topic =>
    ({ topic, numPartitions: 3, replicationFactor: 1 })) })
  await admin.disconnect()
  const producer = kafka.producer()
  await producer.connect()
  const messages = []
  for (let i = 0; i < count; i++) messages.push({ key: `id-${i}`, value: `id-${i}` })
  for (let i = 0; i < messages.length; i += 100) {
    await producer.send({ topic: input, messages: messages.slice(i, i + 100) })
  }
  await producer.disconnect()
  console.log(`sent ${count}`)
}

async function copy (groupId, transactionalId) {
  const admin = kafka.admin()
  await admin.connect()
  const ends = {}
  for (const p of await admin.fetchTopicOffsets(input)) ends[p.partition] = Number(p.high)
  const done = {}
  for (const t of await admin.fetchOffsets({ groupId, topics: [input] })) {
    for (const p of t.partitions) done[p.partition] = Math.max(Number(p.offset), 0)
  }
  await admin.disconnect()
  const finished = () => Object.keys(ends).every(p => (done[p] || 0) >= ends[p])

  const producer = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 })
  const consumer = kafka.consumer({ groupId, readUncommitted: false, sessionTimeout: 10000,
                                    maxBytesPerPartition: 2048 })
  await producer.connect()
  await consumer.connect()
  await consumer.subscribe({ topic: input, fromBeginning: true })
  let copied = 0
  let resolveDone
  const allDone = new Promise(resolve => { resolveDone = resolve })
  if (finished()) resolveDone()
  await consumer.run({
    autoCommit: false,
    eachBatchAutoResolve: false,
    eachBatch: async ({ batch, resolveOffset, heartbeat, isRunning, isStale }) => {
      if (!isRunning() || isStale() || batch.messages.length === 0) return
      const transaction = await producer.transaction()
      try {
        await transaction.send({ topic: output, messages: batch.messages.map(m =>
          ({ key: m.key, value: m.value })) })
        const next = (BigInt(batch.lastOffset()) + 1n).toString()
        await transaction.sendOffsets({ consumerGroupId: groupId, topics: [
          { topic: batch.topic, partitions: [{ partition: batch.partition, offset: next }] }] })
        await transaction.commit()
      } catch (e) {
        console.error(`aborting: ${e}`)
        await transaction.abort()
        throw e
      }
      for (const m of batch.messages) resolveOffset(m.offset)
      await heartbeat()
      copied += batch.messages.length
      done[batch.partition] = Number(batch.lastOffset()) + 1
      console.log(`committed ${copied}`)
      if (finished()) resolveDone()
    }
  })
  await allDone
  await consumer.disconnect()
  await producer.disconnect()
  console.log('copied everything')
}

async function read (count) {
  const consumer = kafka.consumer({ groupId: `kafkajs-read-${Date.now()}`, readUncommitted: false,
                                    maxWaitTimeInMs: 500 })
  const values = []
  let fetchesAfter = 0
  let resolveDone
  const allDone = new Promise(resolve => { resolveDone = resolve })
  // Records still arriving after COUNT (duplicates) come in the fetches that follow.
  consumer.on(consumer.events.FETCH, () => {
    if (values.length >= count && ++fetchesAfter >= 3) resolveDone()
  })
  await consumer.connect()
  await consumer.subscribe({ topic: input, fromBeginning: true })
  await consumer.run({ autoCommit: false, eachMessage: async ({ message }) => {
    values.push(message.value.toString())
  } })
  const timer = setTimeout(() => resolveDone(), 120000)
  await allDone
  clearTimeout(timer)
  await consumer.disconnect()
  console.log(values.join('\n'))
}

(async () => {
  if (mode === 'setup') await setup(Number(rest[0]))
  else if (mode === 'copy') await copy(rest[0], rest[1])
  else if (mode === 'read') await read(Number(output))
  else throw new Error(`unknown mode ${mode}`)
})().then(() => process.exit(0), e => { console.error(e); process.exit(1) })
