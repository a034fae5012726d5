#include <cxxabi.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "system_impl.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/core/log.hpp"

namespace troupe {
namespace detail {

namespace {

std::string demangle(const char* mangled) {
  int status = 0;
  char* s = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string out = (status == 0 && s) ? s : mangled;
  std::free(s);
  return out;
}

}  // namespace

// --- services used by the typed front end ----------------------------------------

TimerService& timers_of(SystemImpl& s) noexcept { return s.timers; }
Clock& clock_of(SystemImpl& s) noexcept { return *s.clock; }
void count_mailbox_full(SystemImpl& s) noexcept {
  s.mailbox_overflows.fetch_add(1, std::memory_order_relaxed);
}
void count_stale_timer(SystemImpl& s) noexcept {
  s.stale_timers.fetch_add(1, std::memory_order_relaxed);
}
SystemImpl& impl_of(ActorSystem& s) noexcept { return s.impl(); }

void apply_spawn_options(CellBase* cell, const SpawnOptions& o) {
  bool needs = !o.name.empty() || o.mailbox_capacity != 0 || o.stash_capacity != 1000 ||
               o.supervision.directive() != Supervision::Directive::stop;
  if (!needs) return;
  auto& x = cell->extras();
  x.name = o.name;
  x.stash_capacity = o.stash_capacity;
  x.directive = static_cast<std::uint8_t>(o.supervision.directive());
  const auto& p = o.supervision.policy();
  x.min_backoff = p.min_backoff;
  x.max_backoff = p.max_backoff;
  x.backoff_factor = p.factor < 1.0 ? 1.0 : p.factor;
  x.max_restarts = p.max_restarts;
  x.restart_window = p.within;
  if (o.mailbox_capacity != 0) {
    x.capacity = o.mailbox_capacity;
    cell->add_opts(CellBase::kBounded);
  }
}

void system_hold(SystemImpl& s) noexcept { s.cell_created(); }
void system_release(SystemImpl& s) noexcept { s.cell_freed(); }

// Links the new cell under its parent and starts it, all under the parent's
// children lock, so that shutdown (which stops the root's children under the
// same lock) either sees the child or refuses it — never misses it.
bool start_cell(SystemImpl& s, CellBase* cell, CellBase* parent) {
  auto* start = new SysStart();
  bool refused = false;
  {
    auto& px = parent->extras();
    std::lock_guard lk(px.children_mu);
    refused = (parent == s.root && s.root_closed) ||
              (s.closing.load(std::memory_order_acquire) && !s.scheduler.on_worker_thread());
    if (!refused) {
      parent->link_child_locked(px, cell);
      s.spawned.fetch_add(1, std::memory_order_relaxed);
      s.live.fetch_add(1, std::memory_order_relaxed);
      cell->prime_start(start);  // before anything its constructor queued
    }
  }
  if (refused) {
    delete start;
    cell->abandon();
    cell->release();
    return false;
  }
  // Born "scheduled": this is the one schedule() of its first activation.
  bool external = !s.scheduler.on_worker_thread();
  if (external) s.external_inflight.fetch_add(1, std::memory_order_seq_cst);
  s.scheduler.schedule(cell);
  if (external) s.external_inflight.fetch_sub(1, std::memory_order_seq_cst);
  return true;
}

// --- SystemImpl --------------------------------------------------------------------

SystemImpl::SystemImpl(SystemConfig cfg)
    : config(std::move(cfg)),
      clock(config.clock ? config.clock : std::shared_ptr<Clock>(SystemClock::instance())),
      timers(clock),
      scheduler(*this, config.threads, config.throughput) {
  root = new RootCell(this);
  root->extras();
}

SystemImpl::~SystemImpl() = default;

void SystemImpl::start() {
  timers.start();
  scheduler.start();
}

void SystemImpl::cell_created() noexcept { cells_.fetch_add(1, std::memory_order_relaxed); }

void SystemImpl::cell_freed() noexcept {
  if (cells_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

void SystemImpl::shutdown() {
  std::call_once(shutdown_once_, [this] {
    // 0. Layers above stop gracefully first, while actors still take messages.
    std::vector<std::pair<std::uint64_t, std::function<void()>>> hooks;
    {
      std::lock_guard lk(hooks_mu);
      hooks_ran = true;
      hooks.swap(shutdown_hooks);
    }
    for (auto it = hooks.rbegin(); it != hooks.rend(); ++it) it->second();
    closing.store(true, std::memory_order_seq_cst);
    const auto drain = config.shutdown_drain_timeout;
    // 1. Let what is queued run to completion.
    wait_idle(drain);
    // 2. Stop every top-level actor; each stops its children.
    {
      auto& rx = *root->extras_if();
      std::lock_guard lk(rx.children_mu);
      root_closed = true;
      for (CellBase* c = rx.children; c; c = c->sib_next_) c->request_stop_for_shutdown();
    }
    // 3. Wait for them, bounded. (A handler that never returns cannot be
    // preempted: joining its worker below then waits for it.)
    {
      std::unique_lock lk(live_mu);
      bool all = live_cv.wait_for(lk, drain, [&] { return live.load() == 0; });
      if (!all && config.log_failures) {
        log::warn(log::Component::core, "shutdown: actors did not stop in time",
                  {{"actors", live.load()},
                   {"waited_ms", std::chrono::duration_cast<std::chrono::milliseconds>(drain).count()}});
      }
    }
    // 4. Threads.
    timers.stop();
    scheduler.stop();
  });
}

bool SystemImpl::wait_idle(Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int confirmations = 0;
  for (;;) {
    if (scheduler.quiescent() && external_inflight.load(std::memory_order_seq_cst) == 0) {
      // Twice in a row, a little apart: a worker may be between taking a cell
      // and running it only while not parked, so this is conservative.
      if (++confirmations == 2) return true;
    } else {
      confirmations = 0;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void SystemImpl::on_terminated(CellBase* c) noexcept {
  c->release();  // the parent link's reference
  if (live.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard lk(live_mu);
    live_cv.notify_all();
  }
}

void SystemImpl::on_dead_letter(const CellBase& recipient, const char* mangled_type) noexcept {
  auto n = dead_letters.fetch_add(1, std::memory_order_relaxed) + 1;
  // Once the ActorSystem is gone, refs that outlive it are only counted: the
  // user's callback may capture what no longer exists.
  if (!owner_alive.load(std::memory_order_acquire)) return;
  bool logged = config.log_dead_letters && (n <= 10 || n % 1000 == 0) &&
                log::enabled(log::Component::core, log::Level::info);
  if (!logged && !config.on_dead_letter) return;
  try {
    DeadLetter dl{recipient.name(), demangle(mangled_type)};
    if (logged) {
      log::info(log::Component::core,
                n == 10 ? "dead letter (further dead letters are logged one in 1000)" : "dead letter",
                {{"count", n}, {"message_type", dl.message_type}, {"recipient", dl.recipient}});
    }
    if (config.on_dead_letter) config.on_dead_letter(dl);
  } catch (...) {
    // counting must never fail the sender
  }
}

void SystemImpl::log_failure(const CellBase& c, const std::string& what) noexcept {
  if (!config.log_failures || !log::enabled(log::Component::core, log::Level::warn)) return;
  try {
    log::warn(log::Component::core, "actor failed",
              {{"actor", c.name()}, {"actor_type", demangle(c.actor_type_name())}, {"error", what}});
  } catch (...) {
    // out of memory while naming it: the failure is still counted
  }
}

}  // namespace detail

// --- ActorSystem -------------------------------------------------------------------

ActorSystem::ActorSystem(SystemConfig config) : impl_(new detail::SystemImpl(std::move(config))) {
  impl_->start();
}

ActorSystem::~ActorSystem() {
  impl_->shutdown();
  detail::SystemImpl* s = impl_.release();
  s->owner_alive.store(false, std::memory_order_release);
  detail::CellBase* root = s->root;
  s->root = nullptr;
  root->release();
  s->cell_freed();  // the owner's share; the last cell (or this) frees it
}

void ActorSystem::shutdown() { impl_->shutdown(); }

std::uint64_t ActorSystem::add_shutdown_hook(std::function<void()> hook) {
  std::lock_guard lk(impl_->hooks_mu);
  if (impl_->hooks_ran || !hook) return 0;
  std::uint64_t id = ++impl_->next_hook_id;
  impl_->shutdown_hooks.emplace_back(id, std::move(hook));
  return id;
}

void ActorSystem::remove_shutdown_hook(std::uint64_t id) {
  std::lock_guard lk(impl_->hooks_mu);
  auto& h = impl_->shutdown_hooks;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it->first == id) {
      h.erase(it);
      return;
    }
  }
}

bool ActorSystem::wait_idle(Duration timeout) { return impl_->wait_idle(timeout); }

SystemStats ActorSystem::stats() const {
  SystemStats s;
  s.actors_spawned = impl_->spawned.load();
  s.actors_live = impl_->live.load();
  s.dead_letters = impl_->dead_letters.load();
  s.mailbox_overflows = impl_->mailbox_overflows.load();
  s.handler_failures = impl_->failures.load();
  s.restarts = impl_->restarts.load();
  s.stale_timer_fires = impl_->stale_timers.load();
  s.timers_pending = impl_->timers.pending();
  // taken before delivered: a message counted as taken was delivered first,
  // so the difference never goes below zero by the order of the reads.
  s.messages_taken = impl_->scheduler.taken();
  s.messages_delivered = impl_->scheduler.delivered();
  s.mailbox_depth = s.messages_delivered > s.messages_taken ? s.messages_delivered - s.messages_taken : 0;
  s.runnable_actors = impl_->scheduler.runnable();
  return s;
}

Clock& ActorSystem::clock() const { return *impl_->clock; }
std::size_t ActorSystem::threads() const { return impl_->scheduler.size(); }
detail::CellBase* ActorSystem::root() const noexcept { return impl_->root; }

}  // namespace troupe
