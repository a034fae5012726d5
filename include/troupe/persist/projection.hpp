#pragma once
// Projections (SPEC R1): a handler run over a stream of the journal (the
// events of one entity type, or with one tag) that keeps a read model, and
// the offset it reached, in one database.
//
//   struct ByCustomer {
//     using ReadModel = troupe::SqliteReadModel;       // or PostgresReadModel
//     troupe::Result<void> setup(troupe::SqliteTransaction& tx);   // optional: create tables
//     troupe::Result<void> apply(troupe::SqliteTransaction& tx, const troupe::StreamEvent& e);
//   };
//   auto p = troupe::Projection<ByCustomer>::start(system, journal, model,
//       {.name = "payments_by_customer", .source = troupe::EventSelector::of_type("payment")}).value();
//
// A handler may take a whole page instead of one event at a time, to fold
// it before writing (one row per entity, one statement per aggregate):
//
//     troupe::Result<void> apply(Tx& tx, std::span<const troupe::StreamEvent> page, std::size_t& failed_at);
//
// On a failure it sets `failed_at` to the index of the event it failed on
// (it is 0 when called), which the status names as the failure's
// coordinates. The page is applied in one transaction either way.
//
// Exactly once. Each page of events (up to `batch`) is applied in one
// transaction of the read model that also moves the projection's stored
// offset from the one it read to the page's last (read_model.hpp): either
// both are stored or neither, so after a crash the projection resumes where
// its read model stopped; an event is never applied twice or skipped. A
// second instance of the same projection (a paused process, a slice that
// moved) cannot move the offset past the first: its transaction fails and
// it reloads the offset.
//
// Live. The projection listens to the journal's appends (event_query.hpp
// "Live") and queries when told; it also polls every poll_interval, for
// what it cannot be told of (another process's appends on SQLite).
//
// Errors. A handler that fails (returns an error or throws) fails the whole
// page; it is tried again after a back-off (min_backoff doubling to
// max_backoff) up to max_attempts times, and then the projection stops
// with the failing event's coordinates in its status (never skipping it).
// restart() tries again from the stored offset. Journal errors on queries
// are retried the same way, without limit.
//
// Ownership: start() returns a handle; copies share the projection, an
// actor of `system` (its timers follow the system's clock) with one thread
// of its own for the read model's transactions (which may block). It stops
// with the system or on stop(). Thread safety: every member is thread-safe.
// The handler is called by one thread at a time, in the stream's order:
// the projection's own, or, where a read model applies the pages of the
// projections sharing it together (SqliteReadModel), the thread of one of
// them while the others wait. It must not rely on thread-local state.

#include <array>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "troupe/core/actor_system.hpp"
#include "troupe/core/result.hpp"
#include "troupe/persist/event_query.hpp"
#include "troupe/persist/journal.hpp"

namespace troupe {

struct ProjectionSettings {
  // 1 to 128 characters of [A-Za-z0-9._-]; with the source, the key of the
  // stored offset ("<name>/<source>", e.g. "by_customer/tag:payments-3").
  std::string name{};
  EventSelector source{};
  std::size_t batch = 500;  // events per transaction
  Duration poll_interval = std::chrono::seconds(1);
  // After catching up, how long a hint of new events waits before the
  // query, so that the commits of that time go in one page: fewer, larger
  // transactions on a read model that shares its database's write lock
  // (SQLite: the journal's file). Zero: query at once.
  Duration linger = Duration::zero();
  Duration min_backoff = std::chrono::milliseconds(100);
  Duration max_backoff = std::chrono::seconds(10);
  std::uint32_t max_attempts = 10;  // tries of one page before the projection stops
  // Called after each committed page on the projection's thread, with the
  // page (e.g. to measure lag); must be short.
  std::function<void(std::span<const StreamEvent>)> on_applied{};
};

enum class ProjectionState : std::uint8_t {
  running,  // applying, or caught up and waiting for events
  failed,   // stopped on an event its handler kept failing (see failure)
  stopped,  // stop() was called, or the system stopped
};
std::string_view to_string(ProjectionState s) noexcept;

// Where a projection stopped and why. Value type.
struct ProjectionFailure {
  std::string persistence_id;
  std::uint64_t seq = 0;
  JournalOffset offset{};
  std::uint32_t attempts = 0;
  Error error;
};

// A projection's state, counters and lag. Value type.
struct ProjectionStatus {
  std::string key;                  // "<name>/<source>"
  ProjectionState state = ProjectionState::running;
  std::optional<JournalOffset> offset;  // the stored offset; none before the first page
  std::uint64_t events_applied = 0;     // since start
  std::uint64_t pages_applied = 0;
  std::uint64_t retries = 0;            // failed tries (handler, read model or journal) tried again
  std::uint64_t conflicts = 0;          // pages refused because another instance moved the offset
  // How far behind the journal: 0 when the last query found nothing newer;
  // else the wall time from the newest applied event's timestamp to when it
  // was applied (ms).
  std::int64_t lag_ms = 0;
  bool caught_up = false;
  std::optional<ProjectionFailure> failure;
  // Every applied event's lag (ms from its timestamp to the commit of its
  // page), counted in buckets: lag_counts[i] events had a lag of at most
  // projection_lag_bounds_ms[i] (and more than the bound before); the last
  // count is for lags above every bound. Since start.
  std::array<std::uint64_t, 21> lag_counts{};
  std::int64_t lag_sum_ms = 0;
};

// The upper bounds (ms) of ProjectionStatus::lag_counts' buckets.
inline constexpr std::array<std::int64_t, 20> projection_lag_bounds_ms{
    1, 2, 5, 10, 15, 20, 30, 40, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 2000, 5000, 10000};
// The lag (ms) below which a fraction q (0 < q <= 1) of the counted events
// fell: the upper bound of the bucket where the q-quantile lies; nullopt
// when nothing was counted or it lies above every bound.
std::optional<std::int64_t> projection_lag_quantile(const ProjectionStatus& s, double q);

namespace detail {

// A projection's read model, type-erased: the projection's thread calls it.
class ProjectionTarget {
 public:
  virtual ~ProjectionTarget() = default;
  virtual Result<void> setup() = 0;
  virtual Result<std::optional<JournalOffset>> load_offset(const std::string& key) = 0;
  // Applies `events` and moves `key`'s offset from `from` to `to` in one
  // transaction. On a handler failure sets `failed_at` to its index.
  virtual Result<void> apply(const std::string& key, std::optional<JournalOffset> from, JournalOffset to,
                             std::span<const StreamEvent> events, std::size_t& failed_at) = 0;
};

struct ProjectionCore;

// Starts the runtime (projection.cpp) over a target.
Result<std::shared_ptr<ProjectionCore>> start_projection(ActorSystem& system, std::shared_ptr<Journal> journal,
                                                         ProjectionSettings settings,
                                                         std::unique_ptr<ProjectionTarget> target);
ProjectionStatus projection_status(const ProjectionCore& core);
void stop_projection(ProjectionCore& core);
void restart_projection(ProjectionCore& core);
bool wait_projection(ProjectionCore& core, const std::function<bool(const ProjectionStatus&)>& until, Duration bound);

template <class H, class Tx>
concept HasSetup = requires(H& h, Tx& tx) {
  { h.setup(tx) } -> std::same_as<Result<void>>;
};

// A handler that applies a whole page (see the top of this file).
template <class H, class Tx>
concept AppliesPages = requires(H& h, Tx& tx, std::span<const StreamEvent> page, std::size_t& failed_at) {
  { h.apply(tx, page, failed_at) } -> std::same_as<Result<void>>;
};

// A handler over a read model that keeps the offset in its transactions.
template <class Handler>
class ReadModelTarget final : public ProjectionTarget {
 public:
  using Model = typename Handler::ReadModel;
  using Tx = typename Model::Transaction;
  ReadModelTarget(std::shared_ptr<Model> model, Handler h) : model_(std::move(model)), handler_(std::move(h)) {}

  Result<void> setup() override {
    if constexpr (HasSetup<Handler, Tx>) return model_->transact([&](Tx& tx) { return handler_.setup(tx); });
    return {};
  }
  Result<std::optional<JournalOffset>> load_offset(const std::string& key) override { return model_->load_offset(key); }
  Result<void> apply(const std::string& key, std::optional<JournalOffset> from, JournalOffset to,
                     std::span<const StreamEvent> events, std::size_t& failed_at) override {
    return model_->transact(key, from, to, [&](Tx& tx) -> Result<void> {
      if constexpr (AppliesPages<Handler, Tx>) {
        failed_at = 0;
        auto r = handler_.apply(tx, events, failed_at);
        if (r) failed_at = events.size();
        return r;
      } else {
        for (std::size_t i = 0; i < events.size(); ++i) {
          failed_at = i;
          if (auto r = handler_.apply(tx, events[i]); !r) return r;
        }
        failed_at = events.size();
        return {};
      }
    });
  }

 private:
  std::shared_ptr<Model> model_;
  Handler handler_;
};

}  // namespace detail

template <class Handler>
class Projection {
 public:
  using ReadModel = typename Handler::ReadModel;

  // invalid_argument: a bad name, source (validate_query's rules), batch
  // (1 to max_query_limit), intervals or attempts; a journal without the
  // global order; no read model. The handler's setup() runs first (on the
  // projection's thread); its failure stops the projection as a failed
  // page would. shutting_down: the system no longer spawns.
  static Result<Projection> start(ActorSystem& system, std::shared_ptr<Journal> journal,
                                  std::shared_ptr<ReadModel> model, ProjectionSettings settings,
                                  Handler handler = Handler{}) {
    if (!model) return Error(ErrorCode::invalid_argument, "projection '" + settings.name + "' has no read model");
    auto core = detail::start_projection(
        system, std::move(journal), std::move(settings),
        std::make_unique<detail::ReadModelTarget<Handler>>(std::move(model), std::move(handler)));
    if (!core) return std::move(core).error();
    return Projection(std::move(*core));
  }

  ProjectionStatus status() const { return detail::projection_status(*core_); }
  // Stops after the page in flight; the stored offset stays.
  void stop() const { detail::stop_projection(*core_); }
  // After a failure: tries again from the stored offset.
  void restart() const { detail::restart_projection(*core_); }
  // Waits (real time, at most `bound`) until `until(status())` holds; true
  // if it did. For tests and tools; never from an actor.
  bool wait_until(const std::function<bool(const ProjectionStatus&)>& until, Duration bound) const {
    return detail::wait_projection(*core_, until, bound);
  }

 private:
  explicit Projection(std::shared_ptr<detail::ProjectionCore> c) : core_(std::move(c)) {}
  std::shared_ptr<detail::ProjectionCore> core_;
};

}  // namespace troupe
