// Durable jobs across a cluster: a local JobService per queue shard this
// node owns, a keeper thread that starts and stops them as placement says,
// and the routing of jobs to them. See include/troupe/cluster/cluster_jobs.hpp
// for the contract and doc/jobs.md ("In a cluster") for the design.

#include "troupe/cluster/cluster_jobs.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "cluster_jobs_wire.hpp"
#include "keeper.hpp"
#include "troupe/persist/fenced_journal.hpp"

namespace troupe::cluster {
namespace {

using detail::Keeper;
using detail::RemoteAnswer;
using detail::RemoteJob;
using detail::job_wire_codecs;

constexpr int kShardShift = 40;
constexpr std::uint32_t kMaxShards = 4096;
// A job refused by a shard that is stopping or moving is sent again after
// this (to another shard, or the same one's new owner).
constexpr Duration kRetryDelay = std::chrono::milliseconds(20);

JobId global_id(std::uint32_t shard, JobId local) noexcept {
  return (static_cast<JobId>(shard) << kShardShift) | local;
}

// Why a queue shard cannot run, as health() reports it.
Error shard_fault(std::uint32_t shard, std::string_view what, const Error& e) {
  return Error(e.code(), "queue shard " + std::to_string(shard) + " " + std::string(what) + ": " + e.message());
}

// --- a job on its way to a shard ---------------------------------------------------

struct Req {
  Job job;
  int priority = 0;
  std::optional<Duration> timeout;
  bool want_outcome = false;
  // One of the two, as want_outcome says (a promise allocates its state).
  std::optional<Promise<JobId>> accepted;      // enqueue()
  std::optional<Promise<JobOutcome>> outcome;  // submit()
  std::uint32_t tries = 0;
  std::optional<TimePoint> give_up;  // set by the router, on its clock

  void fail(Error e) {
    if (want_outcome)
      outcome->set_error(std::move(e));
    else
      accepted->set_error(std::move(e));
  }
};

// Errors of a shard's service that mean the job was not accepted there, so
// it may be sent to another shard: the shard stops (moved, or the node
// leaves) or stopped on a fault.
bool not_taken(const Error& e) {
  return e.code() == ErrorCode::shutting_down || e.code() == ErrorCode::journal_conflict;
}

struct Route {
  std::shared_ptr<Req> req;
};
struct Located {
  std::uint32_t shard = 0;
  std::string owner;  // empty: not known
};
struct Moved {
  std::uint32_t shard = 0;
  std::string owner;  // the node that said it does not serve the shard
  std::shared_ptr<Req> req;
};
struct NodeGone {  // left the cluster or declared dead: owns nothing now
  std::string node;
};
using RouterMsg = std::variant<Route, Located, Moved, NodeGone>;

struct Core;

// Sends jobs to shards on other nodes (this node serves none right now).
class Router final : public Actor<RouterMsg> {
 public:
  // A weak reference: the cell keeps its actor's constructor arguments,
  // and the core holds the cell. The running router keeps the core alive.
  explicit Router(const std::weak_ptr<Core>& core) : core_(core), keep_(core.lock()) {}
  void receive(RouterMsg& m);
  void on_stop();

 private:
  void route(std::shared_ptr<Req> r);
  void send(std::uint32_t shard, const std::string& owner, std::shared_ptr<Req> r);
  void later(std::shared_ptr<Req> r);

  std::weak_ptr<Core> core_;
  std::shared_ptr<Core> keep_;
  std::vector<std::string> owners_;
  std::vector<bool> locating_;
  std::map<std::uint32_t, std::vector<std::shared_ptr<Req>>> waiting_;  // for a locate
  std::uint32_t next_ = 0;
  std::uint64_t next_key_ = 0;
};

// Takes jobs that other nodes send to this node's shards.
class Intake final : public Actor<RemoteJob> {
 public:
  explicit Intake(const std::weak_ptr<Core>& core) : core_(core) {}
  void receive(RemoteJob& m);

 private:
  std::weak_ptr<Core> core_;
};

struct Hosted {
  std::uint64_t epoch = 0;
  std::optional<JobService> service;  // empty while it could not start
  // Being handed off: paused, its running attempts finishing until then.
  std::optional<std::chrono::steady_clock::time_point> drain_until;
};

struct Core : std::enable_shared_from_this<Core> {
  ActorSystem* system = nullptr;
  Remoting* remoting = nullptr;
  ShardDirectory* directory = nullptr;
  JobSettings settings;
  JobTranslator translator;
  JobWorkers workers;
  ClusterJobSettings cluster;
  std::string type;
  std::string self;
  std::shared_ptr<const MessageCodecs<RemoteJob>> codecs;
  ActorRef<RouterMsg> router;
  ActorRef<RemoteJob> intake;
  Keeper keeper;
  std::atomic<bool> stopped{false};
  // This node lost its lease: a hand-off in progress stops draining.
  std::atomic<bool> fenced{false};
  mutable std::atomic<std::uint64_t> rr{0};

  mutable std::mutex mu;
  std::map<std::uint32_t, std::uint64_t> wanted;  // shards placement gave this node, by epoch
  std::map<std::uint32_t, Hosted> hosted;
  std::vector<std::pair<std::uint32_t, JobService>> serving;  // running, for the round robin
  std::map<std::uint32_t, Error> faults;                      // shards that cannot run now, and why
  std::map<std::uint32_t, std::uint64_t> pending_release;     // asked back, not yet released
  bool paused = false;
  JobStats retired;                       // of services stopped here
  std::deque<JobDeadLetter> retired_dead;  // theirs, most recent last

  void log(const std::string& what) const {
    if (settings.log) std::fprintf(stderr, "troupe: job service '%s': %s\n", settings.name.c_str(), what.c_str());
  }

  // --- routing ---

  std::optional<std::pair<std::uint32_t, JobService>> pick_local() const {
    std::lock_guard lk(mu);
    if (serving.empty()) return std::nullopt;
    return serving[rr.fetch_add(1, std::memory_order_relaxed) % serving.size()];
  }

  void dispatch(std::shared_ptr<Req> r) {
    if (stopped.load(std::memory_order_acquire))
      return r->fail(Error(ErrorCode::shutting_down, "job service '" + settings.name + "' is stopping"));
    auto local = pick_local();
    if (!local) {
      if (router.tell(Route{r}) != Delivery::delivered)
        r->fail(Error(ErrorCode::shutting_down, "job service '" + settings.name + "' is stopping"));
      return;
    }
    auto [shard, svc] = std::move(*local);
    ++r->tries;
    std::weak_ptr<Core> weak = weak_from_this();
    auto retry_or = [weak, r, shard](Error e) {
      auto core = weak.lock();
      // Not accepted by a shard that is going (handed off, or stopped on a
      // fault): no job goes there again, and another shard takes this one.
      if (core && not_taken(e) && !core->stopped.load(std::memory_order_acquire) &&
          r->tries < 2 * core->cluster.shard_count + 4) {
        core->unserve(shard);
        return core->dispatch(r);
      }
      r->fail(std::move(e));
    };
    if (r->want_outcome) {
      // Not re-sent: a shard that stops answers its accepted jobs
      // shutting_down too (they run on its next owner), and a submit's
      // answer cannot tell those from a refusal.
      svc.submit(r->job, r->priority, r->timeout).then([r, weak, shard](Result<JobOutcome> o) mutable {
        if (o.ok()) return r->outcome->set_value(std::move(o).value());
        if (auto core = weak.lock(); core && not_taken(o.error())) core->unserve(shard);
        r->outcome->set_error(std::move(o).error());
      });
    } else {
      svc.enqueue(r->job, r->priority, r->timeout).then([r, shard, retry_or](Result<JobId> id) mutable {
        if (id.ok()) return r->accepted->set_value(global_id(shard, id.value()));
        retry_or(std::move(id).error());
      });
    }
  }

  // --- hosting (keeper thread) ---

  JobSettings shard_settings(std::uint32_t shard, std::uint64_t epoch) {
    JobSettings s = settings;
    s.name = settings.name + "/" + std::to_string(shard);
    // The shard's log is written under the placement epoch (SPEC E9): once a
    // newer owner raised its fence, nothing this incarnation appends is
    // stored, however late it wakes up.
    s.journal = FencedJournal::open(settings.journal, Fence{"jobs/" + s.name, epoch});
    // Paused until start_shard has checked that placement still wants it
    // here (a hand-off or a fence may arrive while its log is read).
    s.start_paused = true;
    if (settings.on_outcome) {
      s.on_outcome = [fn = settings.on_outcome, shard](JobId id, const Job& j, const JobOutcome& o) {
        fn(global_id(shard, id), j, o);
      };
    }
    return s;
  }

  // Placement asked for `shard` back: no new job goes to it, and no queued
  // one starts; the running ones finish while the keeper gets to it. Several
  // shards handed off at once drain side by side.
  void begin_hand_off(std::uint32_t shard) {
    std::lock_guard lk(mu);
    wanted.erase(shard);
    std::erase_if(serving, [&](const auto& s) { return s.first == shard; });
    auto h = hosted.find(shard);
    if (h == hosted.end() || !h->second.service) return;
    h->second.service->pause();
    h->second.drain_until = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(cluster.stop_bound);
  }

  // This node lost its lease: others may take the shard once the takeover
  // margin has passed, so it stops now, not when the keeper gets to it
  // (which may be busy draining or reading a log). The keeper then waits
  // for the stop and releases it.
  void fence_shard(std::uint32_t shard) {
    fenced.store(true, std::memory_order_relaxed);
    std::optional<JobService> svc;
    {
      std::lock_guard lk(mu);
      wanted.erase(shard);
      std::erase_if(serving, [&](const auto& s) { return s.first == shard; });
      if (auto h = hosted.find(shard); h != hosted.end() && h->second.service) svc = h->second.service;
    }
    if (svc) (void)svc->stop(Duration::zero());  // starts the stop; does not wait
  }

  void unserve(std::uint32_t shard) {
    std::lock_guard lk(mu);
    std::erase_if(serving, [&](const auto& s) { return s.first == shard; });
  }

  void rebuild_serving() {  // under mu
    serving.clear();
    // Not a shard placement has asked back (being handed off or stopped).
    for (auto& [shard, h] : hosted)
      if (h.service && wanted.count(shard) && h.service->health().ok()) serving.emplace_back(shard, *h.service);
  }

  void start_shard(std::uint32_t shard, std::uint64_t epoch) {
    {
      std::lock_guard lk(mu);
      auto w = wanted.find(shard);
      if (w == wanted.end() || w->second != epoch || stopped.load()) return;
      if (auto h = hosted.find(shard); h != hosted.end() && h->second.service) return;
    }
    auto svc = JobService::start(*system, shard_settings(shard, epoch), translator, workers);
    std::unique_lock lk(mu);
    if (auto w = wanted.find(shard); svc.ok() && (w == wanted.end() || w->second != epoch || stopped.load())) {
      // Asked back while it started: it never ran a job here.
      lk.unlock();
      (void)svc->stop(cluster.stop_bound);
      return;
    }
    fenced.store(false, std::memory_order_relaxed);  // owning shards again
    if (!svc.ok()) {
      log("queue shard " + std::to_string(shard) + " could not start: " + svc.error().to_string());
      faults.insert_or_assign(shard, shard_fault(shard, "could not start", svc.error()));
      std::weak_ptr<Core> weak = weak_from_this();
      keeper.post(
          [weak, shard, epoch] {
            if (auto c = weak.lock()) c->start_shard(shard, epoch);
          },
          cluster.restart_delay);
      return;
    }
    faults.erase(shard);
    if (!paused) svc->resume();
    hosted.insert_or_assign(shard, Hosted{epoch, std::move(svc).value(), std::nullopt});
    rebuild_serving();
  }

  // Stops a service taken out of `hosted` (bounded) and keeps its counters
  // and dead letters.
  void stop_and_retire(std::uint32_t shard, JobService& svc) {
    if (auto r = svc.stop(cluster.stop_bound); !r.ok()) log("queue shard " + std::to_string(shard) + ": " + r.error().to_string());
    std::lock_guard lk(mu);
    retire(shard, svc);
  }

  void retire(std::uint32_t shard, JobService& svc) {  // under mu
    JobStats s = svc.stats();
    add_stats(retired, s);
    for (auto& d : svc.dead_letters()) {
      d.id = global_id(shard, d.id);
      retired_dead.push_back(std::move(d));
      if (retired_dead.size() > settings.dead_letter_capacity) retired_dead.pop_front();
    }
  }

  // A hand-off lets the running attempts finish first (bounded by
  // stop_bound): their outcomes are then in the log and the new owner does
  // not run them again. An immediate stop (this node lost its lease; others
  // may take the shard soon) does not wait.
  void stop_shard(std::uint32_t shard, std::uint64_t epoch, bool immediate) {
    std::optional<JobService> svc;
    std::optional<std::chrono::steady_clock::time_point> drain_until;
    {
      std::lock_guard lk(mu);
      faults.erase(shard);
      if (auto h = hosted.find(shard); h != hosted.end()) {
        svc = std::move(h->second.service);
        drain_until = h->second.drain_until;
        hosted.erase(h);
        rebuild_serving();
      }
    }
    if (svc) {
      if (!immediate && drain_until) {
        while (svc->stats().active > 0 && std::chrono::steady_clock::now() < *drain_until &&
               !fenced.load(std::memory_order_relaxed))
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      stop_and_retire(shard, *svc);
    }
    {
      std::lock_guard lk(mu);
      if (auto p = pending_release.find(shard); p != pending_release.end() && p->second == epoch) pending_release.erase(p);
    }
    directory->released(type, shard, epoch);
  }

  // Every restart_delay: a shard whose service stopped on a fault is read
  // from its log again (another writer appended; whatever it wrote is now
  // part of the queue).
  void sweep() {
    std::vector<std::pair<std::uint32_t, std::uint64_t>> again;
    {
      std::lock_guard lk(mu);
      rebuild_serving();  // a shard unserved after one refusal that came back
      for (auto& [shard, h] : hosted) {
        if (!h.service) continue;
        if (auto ok = h.service->health(); !ok.ok()) {
          faults.insert_or_assign(shard, shard_fault(shard, "stopped", ok.error()));
          again.emplace_back(shard, h.epoch);
        }
      }
    }
    for (auto [shard, epoch] : again) {
      std::optional<JobService> svc;
      {
        std::lock_guard lk(mu);
        auto h = hosted.find(shard);
        if (h == hosted.end() || !h->second.service) continue;
        svc = std::move(h->second.service);
        h->second.service.reset();
        rebuild_serving();
      }
      stop_and_retire(shard, *svc);
      log("queue shard " + std::to_string(shard) + " is read from its log again");
      start_shard(shard, epoch);
    }
  }

  static void add_stats(JobStats& to, const JobStats& s) {
    for (const auto& l : s.queued_by_priority) {
      auto it = std::find_if(to.queued_by_priority.begin(), to.queued_by_priority.end(),
                             [&](const JobQueueLevel& x) { return x.priority == l.priority; });
      if (it == to.queued_by_priority.end())
        to.queued_by_priority.push_back(l);
      else
        it->depth += l.depth;
    }
    std::sort(to.queued_by_priority.begin(), to.queued_by_priority.end(),
              [](const JobQueueLevel& a, const JobQueueLevel& b) { return a.priority > b.priority; });
    to.queued += s.queued;
    to.waiting_retry += s.waiting_retry;
    to.active += s.active;
    to.idle += s.idle;
    to.submitted += s.submitted;
    to.accepted += s.accepted;
    to.recovered += s.recovered;
    to.succeeded += s.succeeded;
    to.failed += s.failed;
    to.timed_out += s.timed_out;
    to.retried += s.retried;
    to.dead_lettered += s.dead_lettered;
    to.dead_letters_dropped += s.dead_letters_dropped;
    to.refused += s.refused;
    to.watchdog_resets += s.watchdog_resets;
    to.late_completions += s.late_completions;
    to.journal_appends += s.journal_appends;
    to.journal_failures += s.journal_failures;
  }

  // Stops every shard here first, then releases the ones placement had
  // asked back (their stop was still queued), and only then detaches: a
  // shard is never released while it still runs. Shards still owned stay
  // placed on this node until it leaves the cluster. False if a shard's
  // service did not stop within `bound` (counted from the call).
  bool shutdown(Duration bound) {
    if (stopped.exchange(true, std::memory_order_acq_rel)) return true;
    (void)remoting->unpublish(type);
    keeper.stop();  // finishes the step it is in; drops the rest
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(bound);
    std::vector<std::pair<std::uint32_t, JobService>> services;
    std::vector<std::pair<std::uint32_t, std::uint64_t>> asked_back;
    {
      std::lock_guard lk(mu);
      serving.clear();
      for (auto& [shard, h] : hosted) {
        if (h.service) services.emplace_back(shard, *h.service);
        if (!wanted.count(shard)) asked_back.emplace_back(shard, h.epoch);
      }
      for (auto& [shard, epoch] : pending_release)
        if (!hosted.count(shard)) asked_back.emplace_back(shard, epoch);
    }
    // Starts every stop at once (a zero bound does not wait), then waits.
    for (auto& [shard, svc] : services) (void)svc.stop(Duration::zero());
    bool all = true;
    for (auto& [shard, svc] : services) {
      auto left = std::max(Duration::zero(), std::chrono::duration_cast<Duration>(until - std::chrono::steady_clock::now()));
      all = svc.stop(left).ok() && all;
    }
    {
      std::lock_guard lk(mu);
      for (auto& [shard, svc] : services) retire(shard, svc);
      hosted.clear();
      wanted.clear();
      pending_release.clear();
    }
    for (auto& [shard, epoch] : asked_back) directory->released(type, shard, epoch);
    directory->detach(type);
    router.stop();
    intake.stop();
    return all;
  }
};

void Router::receive(RouterMsg& m) {
  auto core = core_.lock();
  if (!core) return;
  if (owners_.empty()) {
    owners_.resize(core->cluster.shard_count);
    locating_.resize(core->cluster.shard_count, false);
  }
  match(
      m, [&](Route& r) { route(std::move(r.req)); },
      [&](Located& l) {
        locating_[l.shard] = false;
        owners_[l.shard] = l.owner;
        auto w = waiting_.find(l.shard);
        if (w == waiting_.end()) return;
        auto reqs = std::move(w->second);
        waiting_.erase(w);
        for (auto& r : reqs) {
          if (l.owner.empty() || l.owner == core->self)
            later(std::move(r));
          else
            send(l.shard, l.owner, std::move(r));
        }
      },
      [&](Moved& mv) {
        if (owners_[mv.shard] == mv.owner) owners_[mv.shard].clear();
        later(std::move(mv.req));
      },
      [&](NodeGone& g) {
        for (auto& o : owners_)
          if (o == g.node) o.clear();
      });
}

void Router::on_stop() {
  for (auto& [shard, reqs] : waiting_)
    for (auto& r : reqs) r->fail(Error(ErrorCode::shutting_down, "the job service has stopped"));
  waiting_.clear();
  keep_.reset();
}

void Router::later(std::shared_ptr<Req> r) {
  auto core = core_.lock();
  if (!core) return;
  if (r->give_up && now() + kRetryDelay >= *r->give_up) {
    return r->fail(Error(ErrorCode::timeout, "job service '" + core->settings.name + "': no queue shard took the job within " +
                                                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                    core->cluster.route_timeout)
                                                                    .count()) +
                                                 " ms (shards moving, or no node serves one)"));
  }
  std::string key = "retry-" + std::to_string(++next_key_);
  start_timer(std::move(key), kRetryDelay, Route{std::move(r)});
}

void Router::route(std::shared_ptr<Req> r) {
  auto core = core_.lock();
  if (!core) return;
  if (!r->give_up) r->give_up = deadline_after(now(), core->cluster.route_timeout);
  if (core->stopped.load(std::memory_order_acquire))
    return r->fail(Error(ErrorCode::shutting_down, "job service '" + core->settings.name + "' is stopping"));
  // A shard of this node may have started meanwhile.
  if (core->pick_local()) return core->dispatch(std::move(r));
  const std::uint32_t n = core->cluster.shard_count;
  for (std::uint32_t k = 0; k < n; ++k) {
    std::uint32_t shard = (next_ + k) % n;
    const std::string& owner = owners_[shard];
    if (owner.empty() || owner == core->self) continue;
    next_ = shard + 1;
    return send(shard, owner, std::move(r));
  }
  // No known owner elsewhere: ask placement for the next shard (it
  // allocates one that has no owner).
  std::uint32_t shard = next_++ % n;
  waiting_[shard].push_back(std::move(r));
  if (locating_[shard]) return;
  locating_[shard] = true;
  core->directory->locate(core->type, shard, [self = self(), shard](Result<ShardDirectory::Location> loc) {
    (void)self.tell(Located{shard, loc.ok() ? loc.value().owner : std::string()});
  });
}

void Router::send(std::uint32_t shard, const std::string& owner, std::shared_ptr<Req> r) {
  auto core = core_.lock();
  if (!core) return;
  ++r->tries;
  Duration remaining = *r->give_up - now();
  if (remaining <= Duration::zero()) remaining = kRetryDelay;
  if (r->want_outcome) {
    // A submit is answered with the outcome: every attempt's timeout and
    // back-off on top of the routing time.
    const JobSettings& js = core->settings;
    const Duration attempt = r->timeout.value_or(js.default_timeout);
    remaining += attempt * js.max_attempts + js.backoff_max * (js.max_attempts - 1);
  }
  auto ref = core->remoting->remote<RemoteJob>(owner, core->type, core->codecs);
  Future<RemoteAnswer> f = ref.template ask<RemoteAnswer>(
      [&](ReplyTo<RemoteAnswer> rt) {
        RemoteJob m;
        m.shard = shard;
        m.want_outcome = r->want_outcome;
        m.job = r->job;
        m.priority = r->priority;
        m.timeout_ns = r->timeout ? r->timeout->count() : 0;
        m.reply_to = std::move(rt);
        return m;
      },
      remaining);
  std::move(f).then([self = self(), r, shard, owner](Result<RemoteAnswer> a) {
    if (!a.ok()) return r->fail(std::move(a).error());
    RemoteAnswer& ans = a.value();
    switch (ans.kind) {
      case RemoteAnswer::accepted:
        if (r->want_outcome) return r->fail(Error(ErrorCode::protocol_error, "an acceptance answered a submit"));
        return r->accepted->set_value(ans.id);
      case RemoteAnswer::finished:
        if (!r->want_outcome) return r->fail(Error(ErrorCode::protocol_error, "an outcome answered an enqueue"));
        return r->outcome->set_value(std::move(ans.outcome));
      case RemoteAnswer::moved:
        if (self.tell(Moved{shard, owner, r}) != Delivery::delivered)
          r->fail(Error(ErrorCode::shutting_down, "the job service is stopping"));
        return;
      default:
        return r->fail(Error(static_cast<ErrorCode>(ans.code), std::move(ans.message)));
    }
  });
}

void Intake::receive(RemoteJob& m) {
  auto core = core_.lock();
  auto moved = [&] {
    RemoteAnswer a;
    a.kind = RemoteAnswer::moved;
    m.reply_to.reply(std::move(a));
  };
  if (!core || core->stopped.load(std::memory_order_acquire)) return moved();
  std::optional<JobService> svc;
  {
    std::lock_guard lk(core->mu);
    for (auto& [shard, s] : core->serving)
      if (shard == m.shard) svc = s;
  }
  if (!svc) return moved();
  std::optional<Duration> timeout;
  if (m.timeout_ns != 0) timeout = Duration(m.timeout_ns);
  auto fail = [](ReplyTo<RemoteAnswer>& rt, Error e) {
    RemoteAnswer a;
    a.kind = RemoteAnswer::failed;
    a.code = static_cast<std::uint32_t>(e.code());
    a.message = e.message();
    rt.reply(std::move(a));
  };
  const int priority = static_cast<int>(std::clamp<std::int64_t>(m.priority, INT32_MIN, INT32_MAX));
  if (m.want_outcome) {
    svc->submit(std::move(m.job), priority, timeout)
        .then([rt = std::move(m.reply_to), fail](Result<JobOutcome> o) mutable {
          if (!o.ok()) return fail(rt, std::move(o).error());
          RemoteAnswer a;
          a.kind = RemoteAnswer::finished;
          a.outcome = std::move(o).value();
          rt.reply(std::move(a));
        });
  } else {
    svc->enqueue(std::move(m.job), priority, timeout)
        .then([rt = std::move(m.reply_to), fail, shard = m.shard](Result<JobId> id) mutable {
          RemoteAnswer a;
          if (id.ok()) {
            a.kind = RemoteAnswer::accepted;
            a.id = global_id(shard, id.value());
          } else if (not_taken(id.error())) {
            a.kind = RemoteAnswer::moved;  // not accepted: the caller sends it elsewhere
          } else {
            return fail(rt, std::move(id).error());
          }
          rt.reply(std::move(a));
        });
  }
}

// --- the JobService's backend -------------------------------------------------------

class Backend final : public troupe::detail::JobBackend {
 public:
  explicit Backend(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  Future<JobOutcome> submit(Job job, int priority, std::optional<Duration> timeout) override {
    auto r = make(std::move(job), priority, timeout, true);
    Future<JobOutcome> f = r->outcome->future();
    core_->dispatch(std::move(r));
    return f;
  }
  Future<JobId> enqueue(Job job, int priority, std::optional<Duration> timeout) override {
    auto r = make(std::move(job), priority, timeout, false);
    Future<JobId> f = r->accepted->future();
    core_->dispatch(std::move(r));
    return f;
  }
  void pause() override { set_paused(true); }
  void resume() override { set_paused(false); }

  JobStats stats() const override {
    std::lock_guard lk(core_->mu);
    JobStats s = core_->retired;
    // Counters of a stopped service stay; what is queued or running now is
    // only the running services'.
    s.queued_by_priority.clear();
    s.queued = s.waiting_retry = s.active = s.idle = 0;
    for (auto& [shard, h] : core_->hosted)
      if (h.service) Core::add_stats(s, h.service->stats());
    return s;
  }
  std::vector<JobDeadLetter> dead_letters() const override {
    std::lock_guard lk(core_->mu);
    std::vector<JobDeadLetter> out(core_->retired_dead.begin(), core_->retired_dead.end());
    for (auto& [shard, h] : core_->hosted)
      if (h.service)
        for (auto& d : h.service->dead_letters()) {
          d.id = global_id(shard, d.id);
          out.push_back(std::move(d));
        }
    return out;
  }
  Result<void> stop(Duration bound) override {
    if (core_->shutdown(bound)) return {};
    return Error(ErrorCode::timeout, "job service '" + core_->settings.name + "': a queue shard still running after " +
                                         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(bound).count()) +
                                         " ms");
  }
  Result<void> health() const override {
    std::lock_guard lk(core_->mu);
    if (!core_->faults.empty()) return core_->faults.begin()->second;
    for (auto& [shard, h] : core_->hosted) {
      if (!h.service) continue;
      if (auto ok = h.service->health(); !ok.ok())
        return shard_fault(shard, "stopped", ok.error());
    }
    return {};
  }
  const JobSettings& settings() const noexcept override { return core_->settings; }

 private:
  static std::shared_ptr<Req> make(Job job, int priority, std::optional<Duration> timeout, bool want_outcome) {
    auto r = std::make_shared<Req>();
    r->job = std::move(job);
    r->priority = priority;
    r->timeout = timeout;
    r->want_outcome = want_outcome;
    if (want_outcome)
      r->outcome.emplace();
    else
      r->accepted.emplace();
    return r;
  }
  void set_paused(bool p) {
    std::lock_guard lk(core_->mu);
    core_->paused = p;
    // Not the shards being handed off or stopped: they stay paused.
    for (auto& [shard, h] : core_->hosted)
      if (h.service && !h.drain_until && core_->wanted.count(shard)) p ? h.service->pause() : h.service->resume();
  }

  std::shared_ptr<Core> core_;
};

}  // namespace

Result<JobService> start_job_service(ActorSystem& system, Remoting& remoting, ShardDirectory& directory,
                                     JobSettings settings, JobTranslator translator, JobWorkers workers,
                                     ClusterJobSettings cluster) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::invalid_argument, "job service '" + settings.name + "': " + what);
  };
  if (auto ok = troupe::detail::check_job_settings(settings, translator, workers); !ok.ok())
    return std::move(ok).error();
  if (!settings.journal)
    return bad("a cluster-wide job service needs the cluster's journal (settings.journal); without one, "
               "use JobService::start on each node");
  if (cluster.shard_count == 0 || cluster.shard_count > kMaxShards)
    return bad("shard_count must be 1.." + std::to_string(kMaxShards));
  if (cluster.route_timeout <= Duration::zero()) return bad("route_timeout must be positive");
  if (cluster.stop_bound <= Duration::zero()) return bad("stop_bound must be positive");
  if (cluster.restart_delay <= Duration::zero()) return bad("restart_delay must be positive");

  auto core = std::make_shared<Core>();
  core->system = &system;
  core->remoting = &remoting;
  core->directory = &directory;
  core->settings = std::move(settings);
  core->translator = std::move(translator);
  core->workers = std::move(workers);
  core->cluster = cluster;
  core->type = job_queue_type(core->settings.name);
  core->self = directory.self();
  core->codecs = std::make_shared<const MessageCodecs<RemoteJob>>(job_wire_codecs());
  core->paused = core->settings.start_paused;
  std::weak_ptr<Core> weak = core;

  core->router = system.spawn<Router>(SpawnOptions{.name = core->type + "-router"}, weak);
  core->intake = system.spawn<Intake>(SpawnOptions{.name = core->type + "-intake"}, weak);
  if (!core->router || !core->intake) {
    core->router.stop();
    core->intake.stop();
    return Error(ErrorCode::shutting_down, "job service '" + core->settings.name + "': the actor system is shutting down");
  }
  if (auto r = remoting.publish<RemoteJob>(core->type, core->intake, job_wire_codecs()); !r.ok()) {
    core->router.stop();
    core->intake.stop();
    return bad("a job service of this name runs on this node already (" + r.error().message() + ")");
  }
  core->keeper.start(
      [weak] {
        if (auto c = weak.lock()) c->sweep();
      },
      core->cluster.restart_delay);

  ShardDirectory::Host host;
  host.start = [weak](std::uint32_t shard, std::uint64_t epoch) {
    auto c = weak.lock();
    if (!c) return;
    {
      std::lock_guard lk(c->mu);
      c->wanted.insert_or_assign(shard, epoch);
    }
    c->keeper.post([weak, shard, epoch] {
      if (auto c2 = weak.lock()) c2->start_shard(shard, epoch);
    });
  };
  host.stop = [weak](std::uint32_t shard, std::uint64_t epoch, bool immediate) {
    auto c = weak.lock();
    if (!c) return;
    {
      std::lock_guard lk(c->mu);
      c->pending_release.insert_or_assign(shard, epoch);
    }
    if (immediate)
      c->fence_shard(shard);
    else
      c->begin_hand_off(shard);
    c->keeper.post([weak, shard, epoch, immediate] {
      if (auto c2 = weak.lock()) c2->stop_shard(shard, epoch, immediate);
    });
  };
  host.node_left = [weak](std::string_view node) {
    // Placement moves the node's shards by itself; the router stops sending
    // to it.
    if (auto c = weak.lock()) (void)c->router.tell(NodeGone{std::string(node)});
  };
  if (auto r = directory.attach(core->type, cluster.shard_count, std::move(host)); !r.ok()) {
    core->keeper.stop();
    (void)remoting.unpublish(core->type);
    core->router.stop();
    core->intake.stop();
    return std::move(r).error();
  }
  // Every shard gets an owner now, so each one's log has a node that runs
  // it (a shard nobody located would otherwise wait for its first job).
  for (std::uint32_t s = 0; s < cluster.shard_count; ++s)
    directory.locate(core->type, s, [](Result<ShardDirectory::Location>) {});
  (void)system.add_shutdown_hook([weak] {
    if (auto c = weak.lock()) (void)c->shutdown(c->cluster.stop_bound);
  });
  return troupe::detail::make_job_service(std::make_shared<Backend>(std::move(core)));
}

}  // namespace troupe::cluster
