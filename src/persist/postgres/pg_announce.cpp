// The PostgreSQL journal's announcer (pg_announce.hpp): LISTEN/NOTIFY on
// the schema's channel, so a journal hears of commits other processes'
// journals made on the same schema.

#include "pg_announce.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>

#include "pg_support.hpp"
#include "postgres_writer.hpp"

namespace troupe::pg {

namespace {
// An idle connection is checked this often, so a silently dead one is
// noticed and made again.
constexpr int kIdleCheckMs = 10000;
}  // namespace

struct Announcer::State {
  const Shared& shared;
  std::string listen, notify;
  std::function<void()> heard;
  int wake = -1;  // eventfd: announce() and stop() wake the thread
  std::atomic<bool> due{false};
  std::atomic<bool> stopping{false};
  PgConn conn;

  State(const Shared& s, const std::string& channel, std::function<void()> h)
      : shared(s), listen("LISTEN " + channel), notify("NOTIFY " + channel), heard(std::move(h)) {}
  ~State() {
    if (wake >= 0) ::close(wake);
  }
  void signal() const noexcept {
    const std::uint64_t one = 1;
    (void)!::write(wake, &one, sizeof one);
  }
  // A connection that listens, or an error.
  Result<void> connect() {
    conn.reset();
    auto c = shared.connect({});
    if (!c) return std::move(c).error();
    Outcome o = pg::run(c->get(), listen);
    if (!o.ok) return failed("listen for other journals' commits", o);
    conn = std::move(*c);
    return {};
  }
};

Announcer::Announcer(const Shared& shared, std::string channel, std::function<void()> heard)
    : state_(std::make_unique<State>(shared, channel, std::move(heard))) {}

Announcer::~Announcer() { stop(); }

Result<void> Announcer::open() {
  state_->wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (state_->wake < 0) return Error(ErrorCode::journal_failed, "postgres journal: eventfd failed");
  return state_->connect();
}

void Announcer::start(std::shared_ptr<void> keep_alive) {
  thread_ = std::thread([this, keep_alive = std::move(keep_alive)]() mutable { run(std::move(keep_alive)); });
}

void Announcer::announce() noexcept {
  // Only the first announcement since the thread last sent one wakes it.
  if (!state_->due.exchange(true, std::memory_order_acq_rel)) state_->signal();
}

void Announcer::stop() {
  if (!thread_.joinable()) return;
  state_->stopping.store(true, std::memory_order_release);
  state_->signal();
  if (thread_.get_id() == std::this_thread::get_id())
    thread_.detach();  // it ends when this call returns to its loop
  else
    thread_.join();
}

void Announcer::run(std::shared_ptr<void> keep_alive) {
  State& s = *state_;
  const auto& options = s.shared.options;
  int backoff_ms = 0;
  auto idle_since = std::chrono::steady_clock::now();
  while (!s.stopping.load(std::memory_order_acquire)) {
    if (!s.conn || PQstatus(s.conn.get()) != CONNECTION_OK) {
      if (s.connect()) {
        backoff_ms = 0;
        s.heard();  // what others announced meanwhile is lost: read anyway
      } else {
        backoff_ms = backoff_ms == 0 ? options.reconnect_initial_ms
                                     : std::min(backoff_ms * 2, options.reconnect_max_ms);
        pollfd w{s.wake, POLLIN, 0};
        (void)::poll(&w, 1, backoff_ms);
        std::uint64_t drained = 0;
        (void)!::read(s.wake, &drained, sizeof drained);
        continue;
      }
    }
    PGconn* c = s.conn.get();
    if (s.due.exchange(false, std::memory_order_acq_rel)) {
      if (!pg::run(c, s.notify).ok) {
        s.due.store(true, std::memory_order_release);  // again on the next connection
        s.conn.reset();
        continue;
      }
      idle_since = std::chrono::steady_clock::now();
    }
    pollfd fds[2] = {{PQsocket(c), POLLIN, 0}, {s.wake, POLLIN, 0}};
    const int n = ::poll(fds, 2, kIdleCheckMs);
    if (n == 0 && std::chrono::steady_clock::now() - idle_since >= std::chrono::milliseconds(kIdleCheckMs)) {
      if (!pg::run(c, "SELECT 1").ok) s.conn.reset();
      idle_since = std::chrono::steady_clock::now();
    }
    if ((fds[1].revents & POLLIN) != 0) {
      std::uint64_t drained = 0;
      (void)!::read(s.wake, &drained, sizeof drained);
    }
    if (!s.conn) continue;
    if (PQconsumeInput(c) != 1) {
      s.conn.reset();
      continue;
    }
    bool foreign = false;
    while (PGnotify* note = PQnotifies(c)) {
      if (note->be_pid != PQbackendPID(c)) foreign = true;
      PQfreemem(note);
    }
    if (foreign) s.heard();
  }
  s.conn.reset();
  keep_alive.reset();
}

}  // namespace troupe::pg
