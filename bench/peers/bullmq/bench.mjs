// BullMQ peer of the job-queue workloads: `node bench.mjs <workload>` puts
// 100,000 trivial jobs in a BullMQ queue and then processes them with one
// Worker, the way a Node.js application would do it with the most used Redis
// job queue. The server is the one bench/run starts; its port comes from
// TROUPE_BENCH_REDIS_PORT. Prints one JSON line per metric, in the format of
// bench/common/report.hpp:
//   {"bench":"jobs_c1","value":1234.000,"unit":"jobs/s"}
// Unknown workload -> stderr, exit 2; any error or miscount -> stderr, exit 1.
//
// Workloads: jobs_c1, jobs_c50 (Worker concurrency 1 or 50), jobs_c1_prio,
// jobs_c50_prio (the same with priorities 1..5 cycling; 1 is BullMQ's
// highest). Metrics:
//   <workload>      processed jobs per second: from the moment the worker
//                   starts (connected, all jobs waiting) until the 100,000th
//                   job completed;
//   <workload>_add  jobs added per second in the add phase before it.
//
// Configuration, chosen to give BullMQ its best figure:
//  - all jobs are added first, with Queue.addBulk in chunks of kChunk jobs
//    awaited one after the other (a user feeding a backlog does this; one
//    addBulk call is one pipelined round trip per chunk);
//  - the processor is `async job => job.data.n` and nothing else;
//  - `removeOnComplete: true`: BullMQ's own advice for throughput (its docs,
//    "Auto-removal of jobs"): a completed job is deleted in the same script
//    that completes it instead of being added to the completed set, which
//    otherwise grows by 100,000 hashes and a sorted set. Measured both ways
//    (jobs_c50, three pairs of runs): 12-15% faster than keeping them;
//  - one Worker (its default connection handling: ioredis with BullMQ's
//    settings, one blocking connection for waiting on new jobs) with every
//    other option at BullMQ's defaults: it fetches the next job in the same
//    script call that completes the previous one, which is its fast path;
//  - the Redis client is ioredis, pinned to the release BullMQ 6.7.0 itself
//    is tested with (package.json). package.json also pins msgpackr-extract
//    (the optional native decoder of msgpackr, which BullMQ uses only to
//    encode script arguments, so it plays no part in the figures) to 3.0.4,
//    the newest release whose packages for every platform the registry
//    serves: with 3.0.7 package-lock.json lacks the other platforms' entries
//    and `npm ci` refuses it;
//  - the clock starts after the worker's connection is ready, so connecting
//    is not counted.
//
// Fresh queue name per run; afterwards the queue is obliterated (all its
// keys deleted), so runs against one server do not see each other. Checked:
// every job completed exactly once with its own n as the result, and no job
// is left waiting, active, prioritized, delayed or failed.
//
// The full count runs in reasonable time on the 2-core machine (Redis 7.0,
// Node.js 20): the add phase takes about 5 s, processing about 6 s at
// concurrency 50 and about 30 s at concurrency 1. BENCH_SCALE (a divisor,
// like the C++ side) shrinks the job count for quick checks only; the count
// used is printed on stderr.

import { Queue, Worker } from 'bullmq';
import { performance } from 'node:perf_hooks';

const kJobs = 100_000;
const kChunk = 1_000;
const kPriorities = 5;

const WORKLOADS = {
  jobs_c1: { concurrency: 1, prio: false },
  jobs_c50: { concurrency: 50, prio: false },
  jobs_c1_prio: { concurrency: 1, prio: true },
  jobs_c50_prio: { concurrency: 50, prio: true },
};

function fail(what) {
  process.stderr.write(`bench_bullmq: ${what}\n`);
  process.exit(1);
}

function report(bench, value, unit) {
  process.stdout.write(`{"bench":"${bench}","value":${value.toFixed(3)},"unit":"${unit}"}\n`);
}

function scale() {
  const v = parseInt(process.env.BENCH_SCALE ?? '1', 10);
  return v > 0 ? v : 1;
}

function redisPort() {
  const s = process.env.TROUPE_BENCH_REDIS_PORT;
  if (!s) fail('TROUPE_BENCH_REDIS_PORT is not set (bench/run sets it)');
  const port = Number(s);
  if (!Number.isInteger(port) || port <= 0 || port > 65535) fail(`bad TROUPE_BENCH_REDIS_PORT: ${s}`);
  return port;
}

async function run(name, { concurrency, prio }) {
  const jobs = Math.floor(kJobs / scale());
  const connection = { host: '127.0.0.1', port: redisPort() };
  const queueName = `troupe-bench-${name}-${process.pid}-${Date.now()}`;
  const queue = new Queue(queueName, { connection });
  await queue.waitUntilReady();

  // --- add phase ---
  const addStart = performance.now();
  for (let first = 0; first < jobs; first += kChunk) {
    const batch = [];
    for (let n = first; n < Math.min(jobs, first + kChunk); ++n) {
      const opts = { removeOnComplete: true };
      if (prio) opts.priority = 1 + (n % kPriorities);
      batch.push({ name: 'job', data: { n }, opts });
    }
    await queue.addBulk(batch);
  }
  const addSeconds = (performance.now() - addStart) / 1000;

  // --- process phase ---
  let completed = 0;
  let sum = 0;
  const seen = new Uint8Array(jobs);
  let failed = null;
  let start = 0;
  let resolveDone;
  const done = new Promise((resolve) => { resolveDone = resolve; });
  const worker = new Worker(queueName, async (job) => job.data.n, { connection, concurrency, autorun: false });
  worker.on('completed', (job, result) => {
    if (result !== job.data.n) failed ??= `job ${job.id} returned ${result}, expected ${job.data.n}`;
    if (seen[job.data.n]++) failed ??= `job ${job.id} (n = ${job.data.n}) completed twice`;
    sum += result;
    if (++completed === jobs) resolveDone(performance.now());
  });
  worker.on('failed', (job, err) => { failed ??= `job ${job?.id} failed: ${err?.message}`; resolveDone(0); });
  worker.on('error', (err) => { failed ??= `worker error: ${err?.message}`; resolveDone(0); });
  await worker.waitUntilReady();

  start = performance.now();
  const running = worker.run();
  const end = await done;
  const seconds = (end - start) / 1000;
  await worker.close();
  await running;
  if (failed) fail(failed);

  const expectedSum = (jobs * (jobs - 1)) / 2;
  if (completed !== jobs || sum !== expectedSum)
    fail(`completed ${completed} jobs (sum of results ${sum}), expected ${jobs} (sum ${expectedSum})`);
  const counts = await queue.getJobCounts('waiting', 'active', 'prioritized', 'delayed', 'failed', 'completed');
  const left = Object.entries(counts).filter(([, v]) => v !== 0);
  if (left.length) fail(`jobs left in the queue after the run: ${JSON.stringify(Object.fromEntries(left))}`);

  await queue.obliterate({ force: true });
  await queue.close();

  process.stderr.write(`bench_bullmq: ${name}: ${jobs} jobs added in ${addSeconds.toFixed(2)} s, ` +
                       `processed in ${seconds.toFixed(2)} s\n`);
  report(name, jobs / seconds, 'jobs/s');
  report(`${name}_add`, jobs / addSeconds, 'jobs/s');
}

const workload = process.argv[2];
if (process.argv.length !== 3 || !(workload in WORKLOADS)) {
  if (process.argv.length === 3) process.stderr.write(`bench_bullmq: unknown workload '${workload}'\n`);
  process.stderr.write(`usage: node bench.mjs ${Object.keys(WORKLOADS).join('|')}\n` +
                       '  (needs a Redis server on 127.0.0.1:$TROUPE_BENCH_REDIS_PORT)\n');
  process.exit(2);
}
try {
  await run(workload, WORKLOADS[workload]);
} catch (err) {
  fail(err?.stack ?? String(err));
}
