// Redis lock peer of the keyed-lock workloads: `bench_redis_lock <workload>`
// takes and releases a lock held in Redis, the way applications without an
// actor runtime do it, as fast as this machine lets Redis do it. The server
// is the one bench/run starts; its port comes from TROUPE_BENCH_REDIS_PORT.
// Prints one JSON line per metric (bench/common/report.hpp). Unknown workload
// -> stderr, exit 2; any Redis error or broken invariant -> stderr, exit 1.
//
// Workloads: the shapes of bench/common/lock.hpp, which troupe runs on its
// cluster-wide lock from a second node (bench/troupe/lock_cluster.cpp); that
// header defines the callers, the keys each caller picks, the work under the
// lock and the measurement (locks/s, p50 and p99 latency in us):
//   lock_cluster            1,000 keys, 50 callers
//   lock_cluster_contended  1 key,     50 callers
//
// The lock, as commonly written for a single Redis instance:
//  - acquire: SET key token NX PX 30000 (bench::lock::kLeaseMs), the token
//    unique per acquisition ("<pid>.<caller>.<n>"), so a release can only
//    remove its own grant;
//  - release: compare-and-delete in one Lua script, loaded once with
//    SCRIPT LOAD and called with EVALSHA (only the 40-byte hash travels);
//  - a refused acquire (nil reply) retries the same key with the same token
//    after a pause (below).
//
// Choices that give Redis its best figure, measured on the 2-core machine
// the suite runs on (Redis 7.0.15, hiredis 0.14; figures in pairs/s are
// medians of interleaved runs and vary a lot with the machine's load):
//  - Callers: each has its own connection, driven in whichever of two ways
//    is faster for the workload (both measured, fastest_driver says which):
//      threads: one thread per caller on a blocking connection;
//      events:  one thread for all callers, non-blocking sockets, epoll and
//               hiredis' reply reader, each caller one command in flight.
//    lock_cluster (1,000 keys): events 57k vs threads 43k on a quiet
//    machine (24k vs 20k under a parallel build), 50 busy threads sharing
//    the core Redis leaves free cost more than they bring.
//    lock_cluster_contended (1 key): threads 9.0k vs events 6.5k (medians of
//    9 interleaved runs, threads ahead in each): with most callers pausing,
//    the holder's release and re-acquire go fastest on a thread of its own.
//    (Measured when these shapes were named lock_spread and lock_contended.)
//  - Retry: after a pause drawn uniformly from [2.5 ms, 7.5 ms] (kRetryPause
//    +-50%, so waiters do not retry in lock step). On one key an
//    immediate retry is 4 to 8 times slower (1.3k-2.3k against 8k-10k): the
//    49 waiters' refused SETs take most of Redis' one core while the holder
//    waits for its release to be served. With a pause, the waiters leave
//    Redis to the holder, which (the lock having no queue) usually takes the
//    key straight back for its next pair, so the figure rises to that of a
//    single caller; pauses of 1 to 50 ms all reach that ceiling within the
//    noise. Longer pauses buy nothing more and starve callers (at 200 ms
//    one caller got 2 pairs and another 4,241 in one run); at 5 ms every
//    caller still gets a share (stderr prints pairs per caller: min,
//    median, max).
//  - Between acquire and release only the holders check below, as on
//    troupe's side: the figure is the lock's own cost.
//  - TCP over loopback with TCP_NODELAY (hiredis sets it), no pipelining
//    within a caller: a caller cannot send its release before it knows it
//    holds the lock.
//  - The server (bench/run) keeps no append-only file for the lock
//    workloads: troupe's cluster lock keeps its holders and waiters in the
//    owner node's memory as well.
//
// Measurement: bench::lock::Meter (bench/common/lock.hpp). Checked
// on the way: per key, the number of callers that Redis told "you hold it"
// and that have not yet sent their release never exceeds 1; every release
// deletes the caller's own grant (the script returns 1). A caller's count of
// holders drops when it sends its release, before Redis runs the DEL, so a
// second holder seen by the check is a real double grant, never a race in
// the bookkeeping.

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/lock.hpp"
#include "common/report.hpp"

namespace {

constexpr std::chrono::microseconds kRetryPause{5000};  // mean; see the header
constexpr const char* kReleaseScript =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";

enum class Driver { threads, events };

// The faster driver for a shape, see the header.
Driver fastest_driver(const bench::lock::Shape& s) { return s.keys == 1 ? Driver::threads : Driver::events; }

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "bench_redis_lock: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

int redis_port() {
  const char* s = std::getenv("TROUPE_BENCH_REDIS_PORT");
  if (s == nullptr || *s == '\0') fail("TROUPE_BENCH_REDIS_PORT is not set (bench/run sets it)");
  char* end = nullptr;
  const long port = std::strtol(s, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) fail(std::string("bad TROUPE_BENCH_REDIS_PORT: ") + s);
  return static_cast<int>(port);
}

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

Context connect(int port) {
  Context c(redisConnect("127.0.0.1", port));
  if (!c) fail("cannot allocate a redis context");
  if (c->err) fail(std::string("connect to 127.0.0.1:") + std::to_string(port) + ": " + c->errstr);
  return c;
}

Reply command(redisContext* c, const char* what, const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  auto* r = static_cast<redisReply*>(redisvCommand(c, format, ap));
  va_end(ap);
  if (r == nullptr) fail(std::string(what) + ": " + c->errstr);
  if (r->type == REDIS_REPLY_ERROR) fail(std::string(what) + ": " + r->str);
  return Reply(r);
}

// What all callers share: key names, the release script's hash, per key
// the number of callers holding it (see the header), and the measurement.
struct Shared {
  std::vector<std::string> keys;
  std::string sha;
  std::unique_ptr<std::atomic<int>[]> holders;
  std::unique_ptr<bench::lock::Meter> meter;
};

// One caller: its connection, the key and token of its current pair and
// when the pair started, the picker of its keys and the generator that
// jitters retry pauses.
struct Caller {
  Context conn;
  int id = 0;
  std::unique_ptr<bench::lock::KeyPicker> picker;
  std::size_t key = 0;
  bench::lock::Clock::time_point started;
  std::uint64_t acquisitions = 0;
  std::string token;
  std::minstd_rand jitter;

  // The pause before retrying a refused acquire: uniform in [d/2, 3d/2], so
  // the waiters do not retry in lock step.
  std::chrono::microseconds retry_pause(std::chrono::microseconds d) {
    return std::chrono::microseconds(
        std::uniform_int_distribution<long>(d.count() / 2, d.count() * 3 / 2)(jitter));
  }

  void next_pair() {
    key = picker->next();
    started = bench::lock::Clock::now();
    token = std::to_string(::getpid()) + "." + std::to_string(id) + "." + std::to_string(++acquisitions);
  }
  void append_acquire(const Shared& s) {
    const std::string& k = s.keys[key];
    if (redisAppendCommand(conn.get(), "SET %b %b NX PX %d", k.data(), k.size(), token.data(), token.size(),
                           bench::lock::kLeaseMs) != REDIS_OK)
      fail(std::string("SET: ") + conn->errstr);
  }
  // Drops this caller from the key's holders, then queues the release.
  void append_release(Shared& s) {
    s.holders[key].fetch_sub(1, std::memory_order_acq_rel);
    const std::string& k = s.keys[key];
    if (redisAppendCommand(conn.get(), "EVALSHA %b 1 %b %b", s.sha.data(), s.sha.size(), k.data(), k.size(),
                           token.data(), token.size()) != REDIS_OK)
      fail(std::string("EVALSHA: ") + conn->errstr);
  }
  // The reply to SET: true if granted. A grant is checked against holders.
  bool acquired(const Shared& s, const redisReply* r) const {
    if (r->type == REDIS_REPLY_NIL) return false;
    if (r->type != REDIS_REPLY_STATUS || std::strcmp(r->str, "OK") != 0)
      fail("SET: unexpected reply" + std::string(r->type == REDIS_REPLY_ERROR ? std::string(": ") + r->str : ""));
    const int before = s.holders[key].fetch_add(1, std::memory_order_acq_rel);
    if (before != 0)
      fail("lock granted twice: key " + s.keys[key] + " has " + std::to_string(before + 1) + " holders");
    return true;
  }
  // The reply to the release: the pair is complete.
  void released(Shared& s, const redisReply* r) const {
    if (r->type != REDIS_REPLY_INTEGER || r->integer != 1)
      fail("release of " + s.keys[key] + " did not delete the caller's own grant (token " + token + ")" +
           (r->type == REDIS_REPLY_ERROR ? std::string(": ") + r->str : ""));
    s.meter->completed(id, started);
  }
};

// --- driver 1: one thread per caller, blocking connections -----------------------

void run_blocking_caller(Shared& s, Caller& c, const std::atomic<bool>& stop, std::chrono::microseconds retry_delay) {
  while (!stop.load(std::memory_order_relaxed)) {
    c.next_pair();
    for (;;) {
      c.append_acquire(s);
      void* raw = nullptr;
      if (redisGetReply(c.conn.get(), &raw) != REDIS_OK) fail(std::string("SET: ") + c.conn->errstr);
      Reply r(static_cast<redisReply*>(raw));
      if (c.acquired(s, r.get())) break;
      if (retry_delay.count() > 0) std::this_thread::sleep_for(c.retry_pause(retry_delay));
    }
    c.append_release(s);
    void* raw = nullptr;
    if (redisGetReply(c.conn.get(), &raw) != REDIS_OK) fail(std::string("EVALSHA: ") + c.conn->errstr);
    Reply r(static_cast<redisReply*>(raw));
    c.released(s, r.get());
  }
}

// --- driver 2: one thread, non-blocking connections and epoll ---------------------

// Turns a connected blocking context into a non-blocking one: the socket gets
// O_NONBLOCK and hiredis, seeing REDIS_BLOCK cleared, treats EAGAIN as "try
// again later" and redisGetReply only hands out replies already read.
void make_non_blocking(redisContext* c) {
  const int flags = ::fcntl(c->fd, F_GETFL);
  if (flags < 0 || ::fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) < 0) fail("fcntl(O_NONBLOCK) failed");
  c->flags &= ~REDIS_BLOCK;
}

// Every caller keeps one command in flight on its own connection; one thread
// waits for replies on all of them (epoll: a wake-up costs the ready
// connections, not all 50) and parses them with hiredis' reader.
void run_event_driver(Shared& s, std::vector<Caller>& callers, const std::atomic<bool>& stop,
                      std::chrono::microseconds retry_delay) {
  using Clock = std::chrono::steady_clock;
  enum class State { acquiring, releasing, waiting, idle };
  const std::size_t n = callers.size();
  std::vector<State> state(n, State::acquiring);
  std::vector<Clock::time_point> retry_at(n);
  std::vector<bool> want_out(n, false);
  std::size_t waiting = 0;
  std::size_t busy = n;

  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) fail(std::string("epoll_create1: ") + std::strerror(errno));
  auto watch = [&](std::size_t i, int op, bool out) {
    epoll_event ev{};
    ev.events = EPOLLIN | (out ? EPOLLOUT : 0u);
    ev.data.u64 = i;
    if (::epoll_ctl(ep, op, callers[i].conn->fd, &ev) < 0) fail(std::string("epoll_ctl: ") + std::strerror(errno));
    want_out[i] = out;
  };
  // Flushes a caller's output buffer as far as the socket takes it; EPOLLOUT
  // is asked for only while something is left (on loopback, never).
  auto flush = [&](std::size_t i) {
    int written_all = 0;
    if (redisBufferWrite(callers[i].conn.get(), &written_all) != REDIS_OK)
      fail(std::string("write: ") + callers[i].conn->errstr);
    if (want_out[i] == !written_all) return;
    watch(i, EPOLL_CTL_MOD, !written_all);
  };

  for (std::size_t i = 0; i < n; ++i) {
    watch(i, EPOLL_CTL_ADD, false);
    callers[i].next_pair();
    callers[i].append_acquire(s);
    flush(i);
  }

  std::vector<epoll_event> events(n);
  while (busy > 0) {
    timespec timeout{5, 0};
    if (waiting > 0) {
      auto first = Clock::time_point::max();
      for (std::size_t i = 0; i < n; ++i)
        if (state[i] == State::waiting) first = std::min(first, retry_at[i]);
      const auto ns = std::max<long long>(0, std::chrono::nanoseconds(first - Clock::now()).count());
      timeout = {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    }
    const int ready = ::epoll_pwait2(ep, events.data(), static_cast<int>(n), &timeout, nullptr);
    if (ready < 0) {
      if (errno == EINTR) continue;
      fail(std::string("epoll_pwait2: ") + std::strerror(errno));
    }
    const bool stopping = stop.load(std::memory_order_relaxed);
    if (waiting > 0) {
      const auto now = Clock::now();
      for (std::size_t i = 0; i < n; ++i) {
        if (state[i] != State::waiting || retry_at[i] > now) continue;
        callers[i].append_acquire(s);
        state[i] = State::acquiring;
        --waiting;
        flush(i);
      }
    }
    for (int e = 0; e < ready; ++e) {
      const std::size_t i = events[static_cast<std::size_t>(e)].data.u64;
      const std::uint32_t ev = events[static_cast<std::size_t>(e)].events;
      Caller& c = callers[i];
      if (ev & (EPOLLERR | EPOLLHUP)) fail("connection " + std::to_string(i) + " closed");
      if (ev & EPOLLOUT) flush(i);
      if (!(ev & EPOLLIN)) continue;
      if (redisBufferRead(c.conn.get()) != REDIS_OK) fail(std::string("read: ") + c.conn->errstr);
      for (;;) {
        void* raw = nullptr;
        if (redisGetReply(c.conn.get(), &raw) != REDIS_OK) fail(std::string("reply: ") + c.conn->errstr);
        if (raw == nullptr) break;
        Reply r(static_cast<redisReply*>(raw));
        if (state[i] == State::acquiring) {
          if (c.acquired(s, r.get())) {
            c.append_release(s);
            state[i] = State::releasing;
          } else if (retry_delay.count() > 0) {
            state[i] = State::waiting;
            retry_at[i] = Clock::now() + c.retry_pause(retry_delay);
            ++waiting;
          } else {
            c.append_acquire(s);
          }
        } else if (state[i] == State::releasing) {
          c.released(s, r.get());
          if (stopping) {
            state[i] = State::idle;
            --busy;
            continue;
          }
          c.next_pair();
          c.append_acquire(s);
          state[i] = State::acquiring;
        } else {
          fail("unexpected reply on an idle or waiting connection");
        }
      }
      if (state[i] == State::acquiring || state[i] == State::releasing) flush(i);
    }
  }
  ::close(ep);
}

// --- workload ----------------------------------------------------------------------

Driver driver_from_env(Driver fastest) {
  // For re-measuring the choice made in the header; the default is the
  // workload's faster one.
  const char* s = std::getenv("TROUPE_BENCH_REDIS_LOCK_DRIVER");
  if (s == nullptr || *s == '\0') return fastest;
  if (std::strcmp(s, "events") == 0) return Driver::events;
  if (std::strcmp(s, "threads") == 0) return Driver::threads;
  fail(std::string("TROUPE_BENCH_REDIS_LOCK_DRIVER must be 'events' or 'threads', not '") + s + "'");
}

std::chrono::microseconds retry_delay_from_env() {
  // The mean pause before retrying a refused acquire, for re-measuring the
  // choice made in the header (0 retries at once); default kRetryPause.
  const char* s = std::getenv("TROUPE_BENCH_REDIS_LOCK_RETRY_US");
  if (s == nullptr || *s == '\0') return kRetryPause;
  char* end = nullptr;
  const long us = std::strtol(s, &end, 10);
  if (*end != '\0' || us < 0) fail(std::string("bad TROUPE_BENCH_REDIS_LOCK_RETRY_US: ") + s);
  return std::chrono::microseconds(us);
}

void run(const bench::lock::Shape& w) {
  const int port = redis_port();
  const Driver driver = driver_from_env(fastest_driver(w));
  const std::chrono::microseconds retry_delay = retry_delay_from_env();

  Context admin = connect(port);
  Shared s;
  // The pid keeps two runs against one server apart.
  s.keys = bench::lock::key_names(w.keys, "troupe-bench:lock:" + std::to_string(::getpid()) + ":");
  {
    Reply r = command(admin.get(), "SCRIPT LOAD", "SCRIPT LOAD %s", kReleaseScript);
    if (r->type != REDIS_REPLY_STRING) fail("SCRIPT LOAD: unexpected reply");
    s.sha.assign(r->str, r->len);
  }
  s.holders = std::make_unique<std::atomic<int>[]>(s.keys.size());
  for (std::size_t i = 0; i < s.keys.size(); ++i) s.holders[i].store(0);
  s.meter = std::make_unique<bench::lock::Meter>(w.callers);

  std::vector<Caller> callers(static_cast<std::size_t>(w.callers));
  for (int i = 0; i < w.callers; ++i) {
    Caller& c = callers[static_cast<std::size_t>(i)];
    c.conn = connect(port);
    c.id = i;
    c.picker = std::make_unique<bench::lock::KeyPicker>(i, w.keys);
    c.jitter.seed(static_cast<std::uint32_t>(2000 + i));
    if (driver == Driver::events) make_non_blocking(c.conn.get());
  }

  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  if (driver == Driver::threads) {
    for (std::size_t i = 0; i < callers.size(); ++i)
      threads.emplace_back([&, i] { run_blocking_caller(s, callers[i], stop, retry_delay); });
  } else {
    threads.emplace_back([&] { run_event_driver(s, callers, stop, retry_delay); });
  }

  const double seconds = s.meter->measure();
  // Every caller finishes its pair (releasing what it holds) and stops.
  stop = true;
  for (std::thread& t : threads) t.join();

  for (std::size_t i = 0; i < s.keys.size(); ++i)
    if (s.holders[i].load() != 0) fail("a lock is still held after every caller stopped: " + s.keys[i]);
  // Every release deleted its key, so none may be left.
  for (const std::string& k : s.keys) {
    Reply r = command(admin.get(), "EXISTS", "EXISTS %b", k.data(), k.size());
    if (r->type != REDIS_REPLY_INTEGER || r->integer != 0) fail("key left behind: " + k);
  }

  // How evenly the callers got the lock (whole run, warm-up included): a
  // lock without a queue lets a releasing caller take the key straight back.
  if (callers.size() > 1) {
    std::vector<std::uint64_t> per;
    for (const Caller& c : callers) per.push_back(c.acquisitions);
    std::sort(per.begin(), per.end());
    std::fprintf(stderr, "bench_redis_lock: %s: pairs per caller min %llu, median %llu, max %llu\n", w.name,
                 static_cast<unsigned long long>(per.front()), static_cast<unsigned long long>(per[per.size() / 2]),
                 static_cast<unsigned long long>(per.back()));
  }

  if (!s.meter->report(w.name, seconds)) fail("no pair completed within the window");
}

void usage(std::FILE* out) {
  std::fprintf(out, "usage: bench_redis_lock lock_cluster|lock_cluster_contended\n"
                    "  (needs a Redis server on 127.0.0.1:$TROUPE_BENCH_REDIS_PORT)\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    usage(stderr);
    return 2;
  }
  if (const bench::lock::Shape* w = bench::lock::shape(argv[1])) {
    run(*w);
    return 0;
  }
  std::fprintf(stderr, "bench_redis_lock: unknown workload '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
