// The payment demo: thousands of payments settled through a flaky gateway,
// event-sourced on the SQLite journal, with the payment service killed
// mid-run and restarted from its journal.
//
// Two actor systems share the process:
//  - the *payment service*: the payment entities (payment.hpp) in an
//    EntityRegistry over a SqliteJournal. This is what the crash kills;
//  - the *outside world*: the settlement gateway (gateway.hpp) and the
//    checkout, the client that submits payments and waits for their
//    outcome. They survive the crash, as a gateway and a shop would.
// At the end every payment's final state is read back through the registry
// and checked against what the client was told.
//
// Run it with ./scripts/demo (see README.md); --help lists the flags.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "gateway.hpp"
#include "payment.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"

namespace {

using namespace std::chrono_literals;
using payment::Failure;
using payment::Phase;
using payment::PaymentStatus;
using Registry = troupe::EntityRegistry<payment::Payment>;
using Steady = std::chrono::steady_clock;

double ms_between(Steady::time_point a, Steady::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::int64_t wall_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// --- options ---------------------------------------------------------------------

struct Options {
  std::uint64_t payments = 20000;
  std::uint64_t concurrency = 150;
  double latency_ms = 20;
  double jitter_ms = 10;
  double error_rate = 0.05;
  double hang_rate = 0.02;
  double cancel_rate = 0.01;
  std::uint64_t timeout_ms = 1500;
  std::uint64_t downtime_ms = 1000;
  std::string db;  // empty: a fresh file in a temporary directory
  bool keep_db = false;
  bool crash = true;
  std::uint64_t seed = 42;
};

const char* const kUsage = R"(usage: payment_demo [flags]

Settles payments through a simulated gateway, on the SQLite journal, kills
the payment service once mid-run, restarts it from the journal and checks
that every payment ended in a terminal state.

  --payments N        payments to settle                       (default 20000)
  --concurrency N     payments in flight at once               (default 150)
  --latency-ms X      gateway latency, mean                    (default 20)
  --jitter-ms X       gateway latency, +- uniform jitter       (default 10)
  --error-rate P      share the gateway declines, 0..1         (default 0.05)
  --hang-rate P       share the gateway never answers, 0..1    (default 0.02)
  --cancel-rate P     share the client cancels, 0..1           (default 0.01)
  --timeout-ms N      processing timeout of Settling           (default 1500)
  --downtime-ms N     how long the killed service stays down   (default 1000)
  --db PATH           journal file (must not exist yet)        (default: a temp dir)
  --keep-db           keep the journal file at the end
  --no-crash          do not kill the service mid-run
  --seed N            random seed                              (default 42)
  --help              this text
)";

// A bad command line: reported in one line, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::uint64_t parse_uint(std::string_view flag, std::string_view text, std::uint64_t lo, std::uint64_t hi) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || v < lo || v > hi)
    throw UsageError(std::string(flag) + ": expected a whole number from " + std::to_string(lo) + " to " +
                     std::to_string(hi) + ", got '" + std::string(text) + "'");
  return v;
}

double parse_double(std::string_view flag, std::string_view text, double lo, double hi) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || !std::isfinite(v) || v < lo ||
      v > hi) {
    char range[64];
    std::snprintf(range, sizeof range, "%g to %g", lo, hi);
    throw UsageError(std::string(flag) + ": expected a number from " + range + ", got '" + std::string(text) + "'");
  }
  return v;
}

// Options from argv; throws UsageError. Returns nullopt for --help.
std::optional<Options> parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view flag = arg;
    std::optional<std::string_view> inline_value;
    if (auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      flag = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    }
    auto value = [&]() -> std::string_view {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError(std::string(flag) + ": missing value");
      return argv[++i];
    };
    auto no_value = [&] {
      if (inline_value) throw UsageError(std::string(flag) + ": takes no value");
    };
    if (flag == "--help" || flag == "-h") {
      no_value();
      return std::nullopt;
    } else if (flag == "--payments") {
      o.payments = parse_uint(flag, value(), 1, 10'000'000);
    } else if (flag == "--concurrency") {
      o.concurrency = parse_uint(flag, value(), 1, 100'000);
    } else if (flag == "--latency-ms") {
      o.latency_ms = parse_double(flag, value(), 0, 60'000);
    } else if (flag == "--jitter-ms") {
      o.jitter_ms = parse_double(flag, value(), 0, 60'000);
    } else if (flag == "--error-rate") {
      o.error_rate = parse_double(flag, value(), 0, 1);
    } else if (flag == "--hang-rate") {
      o.hang_rate = parse_double(flag, value(), 0, 1);
    } else if (flag == "--cancel-rate") {
      o.cancel_rate = parse_double(flag, value(), 0, 1);
    } else if (flag == "--timeout-ms") {
      o.timeout_ms = parse_uint(flag, value(), 1, 3'600'000);
    } else if (flag == "--downtime-ms") {
      o.downtime_ms = parse_uint(flag, value(), 0, 3'600'000);
    } else if (flag == "--db") {
      o.db = std::string(value());
      if (o.db.empty()) throw UsageError("--db: empty path");
    } else if (flag == "--keep-db") {
      no_value();
      o.keep_db = true;
    } else if (flag == "--no-crash") {
      no_value();
      o.crash = false;
    } else if (flag == "--seed") {
      o.seed = parse_uint(flag, value(), 0, UINT64_MAX);
    } else {
      throw UsageError("unknown flag '" + std::string(arg) + "'");
    }
  }
  if (o.error_rate + o.hang_rate > 1.0)
    throw UsageError("--error-rate plus --hang-rate must not exceed 1");
  if (o.jitter_ms > o.latency_ms) throw UsageError("--jitter-ms must not exceed --latency-ms");
  if (!o.db.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(o.db, ec))
      throw UsageError("--db: '" + o.db + "' already exists; the demo starts from an empty journal");
    auto parent = std::filesystem::path(o.db).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
      throw UsageError("--db: directory '" + parent.string() + "' does not exist");
  }
  return o;
}

// --- the outside world's refund office --------------------------------------------

// Takes the refunds of cancelled payments and numbers them. This demo is
// about settlement and crashes; the node's payment_service (service.cpp)
// hands its refunds to a durable job queue that pays them back through the
// gateway. Used only from its own handler.
class RefundOffice final : public troupe::Actor<payment::QueueRefund> {
 public:
  void receive(payment::QueueRefund& m) { m.reply_to.reply(++taken_); }

 private:
  std::uint64_t taken_ = 0;
};

// --- the payment service: what the crash kills ------------------------------------

// One life of the payment service: its journal, its actor system and the
// payment registry in it. Owned by main; not thread-safe (main drives it).
class PaymentService {
 public:
  static std::unique_ptr<PaymentService> start(const Options& o, const std::string& db,
                                               const troupe::ActorRef<payment::GatewayMsg>& gateway,
                                               const troupe::ActorRef<payment::QueueRefund>& refunds) {
    auto s = std::unique_ptr<PaymentService>(new PaymentService);
    auto j = troupe::SqliteJournal::open(troupe::SqliteJournalOptions{.path = db, .durability = troupe::Durability::full});
    if (!j.ok()) throw std::runtime_error("cannot open the journal: " + j.error().to_string());
    s->journal_ = std::move(*j);

    troupe::SystemConfig cfg;
    cfg.log_dead_letters = false;  // the crash leaves many, by design
    cfg.shutdown_drain_timeout = 2s;
    s->system_ = std::make_unique<troupe::ActorSystem>(std::move(cfg));

    troupe::EntitySettings settings;
    settings.type_name = "payment";
    settings.idle_timeout = 10s;  // finished payments passivate at once; this catches the rest
    troupe::Duration timeout = std::chrono::milliseconds(o.timeout_ms);
    auto reg = Registry::start(*s->system_, s->journal_, settings, payment::payment_codecs(),
                               [gateway, refunds, timeout](const std::string&) {
                                 return payment::Payment(gateway, refunds, timeout);
                               });
    if (!reg.ok()) throw std::runtime_error("cannot start the payment registry: " + reg.error().to_string());
    s->registry_.emplace(std::move(*reg));
    return s;
  }

  const Registry& registry() const { return *registry_; }

  // Dies as a crashed process would: no graceful stop of the entities (an
  // episode in progress is simply cut off), every request in flight fails.
  // The journal keeps exactly what it had committed.
  troupe::EntityStats kill() {
    auto stats = registry_->stats();
    registry_->abandon();
    registry_.reset();
    system_.reset();  // stops every actor where it stands
    std::weak_ptr<troupe::SqliteJournal> gone = journal_;
    journal_.reset();
    // The next life opens the same file, which only works once this journal is closed.
    if (!gone.expired()) throw std::runtime_error("the journal is still referenced after its actor system was destroyed");
    return stats;
  }

  // The orderly end: entities stop (after any episode in progress), then
  // the actor system, then the journal.
  troupe::EntityStats stop() {
    if (auto r = registry_->stop(); !r.ok()) std::fprintf(stderr, "payment_demo: %s\n", r.error().to_string().c_str());
    auto stats = registry_->stats();
    registry_.reset();
    system_->shutdown();
    system_.reset();
    journal_.reset();
    return stats;
  }

 private:
  PaymentService() = default;
  std::shared_ptr<troupe::SqliteJournal> journal_;
  std::unique_ptr<troupe::ActorSystem> system_;
  std::optional<Registry> registry_;
};

// --- the client ------------------------------------------------------------------

// What the checkout shows the progress line. Written by the checkout actor,
// read by main: every member is atomic.
struct Progress {
  std::atomic<std::uint64_t> launched{0}, done{0}, completed{0}, declined{0}, timed_out{0}, cancelled{0}, other{0};
};

// What the checkout saw, handed to main at the end (a copy). Value type.
struct ClientReport {
  std::vector<std::optional<PaymentStatus>> told;  // per payment: the last outcome the client was told
  std::vector<double> settle_latency_ms;           // every Settle answered with an outcome
  std::map<std::string, std::uint64_t> failed_asks;  // asks answered with an error, by error code
  // The payments in flight when the service died, by what the status query
  // found after the restart:
  std::uint64_t caught_in_crash = 0;
  std::uint64_t recovered_in_settling = 0;  // recovered mid-episode; their deadline ended it
  std::uint64_t finished_unseen = 0;        // had finished, the answer was lost
  std::uint64_t never_stored = 0;           // the crash came before SettlementAccepted was stored
  std::uint64_t recovered_not_timed_out = 0;
  std::vector<double> age_at_recovery_ms;  // recovered in Settling: time since SettlementAccepted
  std::vector<double> wait_after_recovery_ms;  // ... and from the recovery to their timeout
};

struct Start {  // the service is up: start submitting
  Registry registry;
};
struct Pause {  // stop submitting; answers how many payments are in flight
  troupe::ReplyTo<std::uint64_t> reply_to;
};
struct Resume {  // the service is back, under a new registry
  Registry registry;
};
struct Recheck {  // retry a payment whose outcome is unknown
  std::size_t index;
};
struct GetReport {
  troupe::ReplyTo<ClientReport> reply_to;
};
using CheckoutMsg = std::variant<Start, Pause, Resume, Recheck, GetReport>;

// The shop's checkout: submits payments (Settle, and Cancel for a few),
// keeping `concurrency` in flight, and waits for each outcome with an ask
// whose continuation runs in this actor (no thread blocks). An ask that
// fails leaves the outcome unknown: the checkout asks the payment's status
// later and submits again (Settle is idempotent per payment id).
// Owns its bookkeeping; thread-safety: an actor, reached through its ref.
class Checkout final : public troupe::Actor<CheckoutMsg> {
 public:
  // (The registry comes by message, not here: a cell keeps its actor's
  // constructor arguments for restarts, and a registry handle kept there
  // would keep the service's journal open after the crash.)
  Checkout(const Options& o, std::shared_ptr<Progress> progress) : opts_(o), progress_(std::move(progress)) {
    std::mt19937_64 rng(o.seed);
    std::uniform_int_distribution<std::int64_t> amount(100, 50'000);
    std::bernoulli_distribution cancel(o.cancel_rate);
    payments_.resize(o.payments);
    for (std::size_t i = 0; i < payments_.size(); ++i) {
      char id[32];
      std::snprintf(id, sizeof id, "pay-%06zu", i + 1);
      payments_[i].id = id;
      payments_[i].order_id = "order-" + std::to_string(100'000 + i);
      payments_[i].amount = amount(rng);
      payments_[i].cancel = cancel(rng);
    }
    // Long enough that the entity's own deadline always answers first.
    ask_timeout_ = std::chrono::milliseconds(o.timeout_ms) + 10s;
  }

  void receive(CheckoutMsg& m) {
    troupe::match(
        m,
        [&](Start& s) {
          registry_ = std::move(s.registry);
          launch_more();
        },
        [&](Pause& p) {
          // The service is about to go down: let go of it (a handle would
          // keep its registry, and so its journal, alive).
          paused_ = true;
          registry_.reset();
          p.reply_to.reply(in_flight_);
        },
        [&](Resume& r) { resume(std::move(r.registry)); }, [&](Recheck& r) { recheck(r.index); },
        [&](GetReport& g) { g.reply_to.reply(report()); });
  }

 private:
  // One payment as the client sees it.
  struct Tracked {
    std::string id, order_id;
    std::int64_t amount = 0;
    bool cancel = false;     // the client cancels this one right after submitting it
    std::uint32_t round = 0;  // answers to an older round's asks are ignored
    int outstanding = 0;      // asks of this round not answered yet
    bool unknown = false;     // an ask of this round failed: the outcome is unknown
    bool done = false;
    bool in_crash = false;       // in flight when the service died
    bool classified = false;     // the status query after the restart has answered
    bool recovered_in_settling = false;
    Steady::time_point recovered_at{};
    std::optional<PaymentStatus> settled, cancelled;
  };

  void launch_more() {
    while (!paused_ && in_flight_ < opts_.concurrency && next_ < payments_.size()) {
      ++in_flight_;
      progress_->launched.fetch_add(1, std::memory_order_relaxed);
      submit(next_++);
    }
  }

  // Sends Settle (and Cancel, for the payments the client cancels) as a new round.
  void submit(std::size_t i) {
    Tracked& t = payments_[i];
    ++t.round;
    t.unknown = false;
    t.outstanding = 0;
    send_settle(i);
    if (t.cancel && !t.cancelled) send_cancel(i);
  }

  void send_settle(std::size_t i) {
    Tracked& t = payments_[i];
    ++t.outstanding;
    auto sent = Steady::now();
    ask<PaymentStatus>(
        registry_->shard_for(t.id),
        [&](troupe::ReplyTo<PaymentStatus> r) {
          return Registry::envelope(t.id, payment::Settle{t.order_id, t.amount, std::move(r), {}});
        },
        ask_timeout_, [this, i, round = t.round, sent](troupe::Result<PaymentStatus> r) {
          Tracked& p = payments_[i];
          if (round != p.round) return;
          if (r.ok()) {
            settle_latency_ms_.push_back(ms_between(sent, Steady::now()));
            if (p.recovered_in_settling) {
              if (r->state.failure == Failure::timed_out) {
                wait_after_recovery_ms_.push_back(ms_between(p.recovered_at, Steady::now()));
              } else {
                ++recovered_not_timed_out_;
              }
            }
            p.settled = std::move(*r);
          }
          answered(i, r);
        });
  }

  void send_cancel(std::size_t i) {
    Tracked& t = payments_[i];
    ++t.outstanding;
    ask<PaymentStatus>(
        registry_->shard_for(t.id),
        [&](troupe::ReplyTo<PaymentStatus> r) { return Registry::envelope(t.id, payment::Cancel{std::move(r)}); },
        ask_timeout_, [this, i, round = t.round](troupe::Result<PaymentStatus> r) {
          Tracked& p = payments_[i];
          if (round != p.round) return;
          if (r.ok()) p.cancelled = std::move(*r);
          answered(i, r);
        });
  }

  void answered(std::size_t i, const troupe::Result<PaymentStatus>& r) {
    Tracked& t = payments_[i];
    --t.outstanding;
    if (!r.ok()) {
      ++failed_asks_[std::string(troupe::to_string(r.error().code()))];
      t.unknown = true;
    }
    if (t.outstanding > 0) return;
    if (!t.unknown) return finish(i);
    if (paused_) {
      unknown_.push_back(i);  // asked about once the service is back
    } else {
      start_timer("recheck-" + t.id, 200ms, Recheck{i});
    }
  }

  void finish(std::size_t i) {
    Tracked& t = payments_[i];
    t.done = true;
    --in_flight_;
    const PaymentStatus* last = t.cancelled ? &*t.cancelled : &*t.settled;
    auto& s = last->state;
    auto& counter = s.phase == Phase::completed                                       ? progress_->completed
                    : s.phase == Phase::cancelled                                     ? progress_->cancelled
                    : s.phase == Phase::failed && s.failure == Failure::declined      ? progress_->declined
                    : s.phase == Phase::failed && s.failure == Failure::timed_out     ? progress_->timed_out
                                                                                      : progress_->other;
    counter.fetch_add(1, std::memory_order_relaxed);
    progress_->done.fetch_add(1, std::memory_order_relaxed);
    launch_more();
  }

  void resume(Registry r) {
    registry_ = std::move(r);
    paused_ = false;
    // Every payment still in flight was caught by the crash, whether its
    // failed ask has come back yet or not.
    for (std::size_t i = 0; i < next_; ++i) {
      if (!payments_[i].done) {
        payments_[i].in_crash = true;
        ++caught_in_crash_;
      }
    }
    for (std::size_t i : unknown_) recheck(i);
    unknown_.clear();
    launch_more();
  }

  // The status query: it starts the payment's recovery in the new service.
  void recheck(std::size_t i) {
    Tracked& t = payments_[i];
    ++t.round;
    t.outstanding = 1;
    t.unknown = false;
    ask<PaymentStatus>(
        registry_->shard_for(t.id),
        [&](troupe::ReplyTo<PaymentStatus> r) { return Registry::envelope(t.id, payment::GetStatus{std::move(r)}); },
        ask_timeout_, [this, i, round = t.round](troupe::Result<PaymentStatus> r) {
          Tracked& p = payments_[i];
          if (round != p.round) return;
          if (!r.ok()) return answered(i, r);
          if (p.in_crash && !p.classified) classify(p, *r);
          submit(i);  // again: the outcome, or the settlement the crash prevented
        });
  }

  void classify(Tracked& t, const PaymentStatus& s) {
    t.classified = true;
    switch (s.state.phase) {
      case Phase::settling:
        ++recovered_in_settling_;
        t.recovered_in_settling = true;
        t.recovered_at = Steady::now();
        age_at_recovery_ms_.push_back(static_cast<double>(wall_ms_now() - s.state.accepted_at_ms));
        break;
      case Phase::waiting_for_request:
        ++never_stored_;
        break;
      case Phase::completed:
      case Phase::failed:
      case Phase::cancelled:
        ++finished_unseen_;
        break;
    }
  }

  ClientReport report() const {
    ClientReport r;
    r.told.reserve(payments_.size());
    for (auto& t : payments_) r.told.push_back(t.cancelled ? t.cancelled : t.settled);
    r.settle_latency_ms = settle_latency_ms_;
    r.failed_asks = failed_asks_;
    r.caught_in_crash = caught_in_crash_;
    r.recovered_in_settling = recovered_in_settling_;
    r.finished_unseen = finished_unseen_;
    r.never_stored = never_stored_;
    r.recovered_not_timed_out = recovered_not_timed_out_;
    r.age_at_recovery_ms = age_at_recovery_ms_;
    r.wait_after_recovery_ms = wait_after_recovery_ms_;
    return r;
  }

  Options opts_;
  std::optional<Registry> registry_;  // empty while the service is down
  std::shared_ptr<Progress> progress_;
  troupe::Duration ask_timeout_{};
  std::vector<Tracked> payments_;
  std::size_t next_ = 0;          // the next payment to submit
  std::uint64_t in_flight_ = 0;   // submitted, outcome not known yet
  bool paused_ = false;
  std::vector<std::size_t> unknown_;  // outcome lost while the service was down
  std::vector<double> settle_latency_ms_;
  std::map<std::string, std::uint64_t> failed_asks_;
  std::uint64_t caught_in_crash_ = 0, recovered_in_settling_ = 0, finished_unseen_ = 0,
                never_stored_ = 0, recovered_not_timed_out_ = 0;
  std::vector<double> age_at_recovery_ms_, wait_after_recovery_ms_;
};

// --- output ---------------------------------------------------------------------

// The single progress line: rewritten in place on a terminal, a plain line
// every two seconds otherwise. Used by main only.
class ProgressLine {
 public:
  ProgressLine(const Progress& p, std::uint64_t total)
      : p_(p), total_(total), tty_(isatty(STDOUT_FILENO) == 1), last_print_(Steady::now()) {}

  void tick(std::string_view note = {}) {
    auto now = Steady::now();
    std::uint64_t done = p_.done.load();
    samples_.emplace_back(now, done);
    while (samples_.size() > 2 && now - samples_.front().first > 1s) samples_.pop_front();
    if (!tty_ && now - last_print_ < 2s && note.empty()) return;
    last_print_ = now;
    double rate = 0;
    if (auto dt = std::chrono::duration<double>(now - samples_.front().first).count(); dt > 0.05)
      rate = static_cast<double>(done - samples_.front().second) / dt;
    std::uint64_t launched = p_.launched.load();
    std::printf("%s  %6llu/%llu done  %4llu in flight  %6.0f payments/s  | %llu completed, %llu declined, "
                "%llu timed out, %llu cancelled%s%.*s%s",
                tty_ ? "\r" : "", ull(done), ull(total_), ull(launched - done), rate, ull(p_.completed.load()),
                ull(p_.declined.load()), ull(p_.timed_out.load()), ull(p_.cancelled.load()), note.empty() ? "" : "  ",
                static_cast<int>(note.size()), note.data(), tty_ ? "\x1b[K" : "\n");
    std::fflush(stdout);
  }
  // Ends the line being rewritten, before other output.
  void break_line() {
    if (tty_) std::fputc('\n', stdout);
  }

  static unsigned long long ull(std::uint64_t v) { return static_cast<unsigned long long>(v); }

 private:
  const Progress& p_;
  std::uint64_t total_;
  bool tty_;
  Steady::time_point last_print_{};
  std::deque<std::pair<Steady::time_point, std::uint64_t>> samples_;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

void add(troupe::EntityStats& a, const troupe::EntityStats& b) {
  a.incarnations_started += b.incarnations_started;
  a.passivations += b.passivations;
  a.recoveries += b.recoveries;
  a.recovery_failures += b.recovery_failures;
  a.events_persisted += b.events_persisted;
  a.processing_timeouts += b.processing_timeouts;
  a.stale_deadlines += b.stale_deadlines;
  a.stash_overflows += b.stash_overflows;
  a.missing_replies += b.missing_replies;
  a.journal_conflicts += b.journal_conflicts;
  a.journal_failures += b.journal_failures;
  a.handler_failures += b.handler_failures;
}

// Events a payment's log holds for its final state, on the paths this
// driver takes (Settle first, a Cancel only after it).
std::uint64_t expected_events(const payment::PaymentState& s) {
  switch (s.phase) {
    case Phase::completed:
    case Phase::failed:
      return 2;  // SettlementAccepted + the outcome
    case Phase::cancelled:
      return s.refunded > 0 ? 3 : 1;
    case Phase::waiting_for_request:
    case Phase::settling:
      break;
  }
  return 0;
}

// The journal's files: the given path, or a fresh temporary directory.
// Removed when this goes out of scope, on every way out of run(), unless
// keep() was called. Declared before the service so that the journal is
// closed first. Owned by run(); not thread-safe.
class JournalFiles {
 public:
  explicit JournalFiles(const std::string& path) : db_(path) {
    if (!db_.empty()) return;
    std::string tmpl = (std::filesystem::temp_directory_path() / "payment_demo.XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("cannot create a temporary directory");
    temp_dir_ = tmpl;
    db_ = (temp_dir_ / "journal.db").string();
  }
  JournalFiles(const JournalFiles&) = delete;
  JournalFiles& operator=(const JournalFiles&) = delete;
  ~JournalFiles() {
    if (keep_) return;
    std::error_code ec;  // best effort: nothing to do about a file that will not go
    if (!temp_dir_.empty()) {
      std::filesystem::remove_all(temp_dir_, ec);
    } else {
      for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::filesystem::remove(db_ + suffix, ec);
    }
  }

  const std::string& db() const { return db_; }
  void keep() { keep_ = true; }

 private:
  std::string db_;
  std::filesystem::path temp_dir_;
  bool keep_ = false;
};

int run(const Options& o) {
  using PL = ProgressLine;
  auto t0 = Steady::now();
  JournalFiles files(o.db);
  const std::string& db = files.db();

  std::printf("troupe payment demo\n");
  std::printf("  %llu payments, %llu in flight at a time, %.1f%% cancelled by the client\n", PL::ull(o.payments),
              PL::ull(o.concurrency), o.cancel_rate * 100);
  std::printf("  gateway: %g ms +- %g ms, %.1f%% declined, %.1f%% never answer; processing timeout %llu ms\n",
              o.latency_ms, o.jitter_ms, o.error_rate * 100, o.hang_rate * 100, PL::ull(o.timeout_ms));
  std::printf("  journal: SQLite, Durability::full, %s\n", db.c_str());
  // Killed once, around half way (a single payment has no half way).
  const bool crash = o.crash && o.payments >= 2;
  const std::uint64_t crash_at = o.payments / 2;
  if (crash) {
    std::printf("  the payment service is killed after %llu payments and restarted %llu ms later\n",
                PL::ull(crash_at), PL::ull(o.downtime_ms));
  }
  std::printf("\n");
  std::fflush(stdout);

  // The outside world: gateway and client. It outlives the crash.
  troupe::SystemConfig outside_cfg;
  outside_cfg.threads = 1;
  troupe::ActorSystem outside(outside_cfg);
  auto gateway_counters = std::make_shared<payment::GatewayCounters>();
  payment::GatewaySettings gw;
  gw.latency_mean = std::chrono::duration_cast<troupe::Duration>(std::chrono::duration<double, std::milli>(o.latency_ms));
  gw.latency_jitter = std::chrono::duration_cast<troupe::Duration>(std::chrono::duration<double, std::milli>(o.jitter_ms));
  gw.decline_rate = o.error_rate;
  gw.hang_rate = o.hang_rate;
  gw.seed = o.seed + 1;
  auto gateway = outside.spawn<payment::SettlementGateway>(troupe::SpawnOptions{.name = "gateway"}, gw, gateway_counters);

  auto refunds = outside.spawn<RefundOffice>(troupe::SpawnOptions{.name = "refunds"});
  auto service = PaymentService::start(o, db, gateway, refunds);
  auto progress = std::make_shared<Progress>();
  auto checkout = outside.spawn<Checkout>(troupe::SpawnOptions{.name = "checkout"}, o, progress);
  checkout.tell(Start{service->registry()});

  PL line(*progress, o.payments);
  troupe::EntityStats runtime{};
  bool crashed = false;
  // A run that stops moving for this long is reported, not waited on forever.
  const auto stall_limit = std::chrono::milliseconds(2 * o.timeout_ms) + 30s;
  std::uint64_t last_done = 0;
  auto last_move = Steady::now();
  for (;;) {
    std::this_thread::sleep_for(100ms);
    std::uint64_t done = progress->done.load();
    line.tick();
    if (done == o.payments) break;
    if (done != last_done) {
      last_done = done;
      last_move = Steady::now();
    } else if (Steady::now() - last_move > stall_limit) {
      line.break_line();
      std::printf("no payment finished for %lld s: giving up (journal kept at %s)\n",
                  static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(stall_limit).count()),
                  db.c_str());
      std::fflush(stdout);
      std::_Exit(1);  // the service may be wedged: do not wait for it to stop
    }
    if (crash && !crashed && done >= crash_at) {
      crashed = true;
      // The client stops submitting while the service is down (as a load
      // balancer would); the payments already in flight see the crash.
      auto paused = outside.ask<std::uint64_t>(
          checkout, [](troupe::ReplyTo<std::uint64_t> r) { return Pause{std::move(r)}; }, 10s).get();
      // Not paused: the client goes on submitting into the crash, and those
      // payments fail as the ones in flight do. Say so; the run stays valid.
      if (!paused.ok()) std::fprintf(stderr, "payment_demo: the client did not pause: %s\n", paused.error().to_string().c_str());
      line.tick("CRASH");
      line.break_line();
      auto k0 = Steady::now();
      add(runtime, service->kill());
      service.reset();
      std::printf("*** the payment service was killed: registry abandoned, actor system and journal destroyed\n"
                  "    without any graceful stop (%.0f ms); the requests in flight fail\n",
                  ms_between(k0, Steady::now()));
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(o.downtime_ms));
      service = PaymentService::start(o, db, gateway, refunds);
      std::printf("*** restarted %llu ms later: journal reopened, new actor system and registry; the client asks\n"
                  "    the payments that were in flight for their status, which recovers them from the journal\n",
                  PL::ull(o.downtime_ms));
      std::fflush(stdout);
      checkout.tell(Resume{service->registry()});
    }
  }
  line.break_line();

  // What the client saw, then what the journal says, payment by payment.
  auto rep = outside.ask<ClientReport>(
      checkout, [](troupe::ReplyTo<ClientReport> r) { return GetReport{std::move(r)}; }, 30s).get();
  if (!rep.ok()) throw std::runtime_error("no report from the checkout: " + rep.error().to_string());
  ClientReport& report = *rep;
  auto q0 = Steady::now();
  std::vector<troupe::Future<PaymentStatus>> queries;
  queries.reserve(o.payments);
  for (std::uint64_t i = 0; i < o.payments; ++i) {
    char id[32];
    std::snprintf(id, sizeof id, "pay-%06llu", PL::ull(i + 1));
    queries.push_back(service->registry().ask<PaymentStatus>(
        id, [](troupe::ReplyTo<PaymentStatus> r) { return payment::GetStatus{std::move(r)}; }, 30s));
  }
  std::uint64_t completed = 0, declined = 0, gateway_errors = 0, timed_out = 0, cancelled = 0, refunded = 0,
                settling = 0, waiting = 0, unreadable = 0, mismatched = 0, bad_logs = 0, events = 0;
  for (std::uint64_t i = 0; i < o.payments; ++i) {
    auto r = queries[i].get();
    if (!r.ok()) {
      ++unreadable;
      if (unreadable <= 3) std::printf("  pay-%06llu: %s\n", PL::ull(i + 1), r.error().to_string().c_str());
      continue;
    }
    const auto& s = r->state;
    events += r->events;
    switch (s.phase) {
      case Phase::completed: ++completed; break;
      case Phase::cancelled: ++cancelled, refunded += s.refunded > 0; break;
      case Phase::settling: ++settling; break;
      case Phase::waiting_for_request: ++waiting; break;
      case Phase::failed:
        if (s.failure == Failure::declined) ++declined;
        else if (s.failure == Failure::timed_out) ++timed_out;
        else ++gateway_errors;
        break;
    }
    if (r->events != expected_events(s)) ++bad_logs;
    const auto& told = report.told[i];
    if (!told || told->state.phase != s.phase || told->state.failure != s.failure) ++mismatched;
  }
  double query_ms = ms_between(q0, Steady::now());
  add(runtime, service->stop());
  service.reset();
  outside.shutdown();
  double wall_s = std::chrono::duration<double>(Steady::now() - t0).count();

  auto row = [](const char* name, std::uint64_t n, const std::string& note = {}) {
    std::printf("  %-28s %7llu%s%s\n", name, PL::ull(n), note.empty() ? "" : "   ", note.c_str());
  };
  auto more = [](const std::string& note) { std::printf("  %-28s %7s   %s\n", "", "", note.c_str()); };
  auto text = [](const char* name, const std::string& t) { std::printf("  %-28s %s\n", name, t.c_str()); };
  auto fmt = [](const char* f, auto... a) {
    char b[256];
    std::snprintf(b, sizeof b, f, a...);
    return std::string(b);
  };
  if (crash) {
    std::printf("\nthe crash\n");
    std::string errors;
    for (auto& [code, n] : report.failed_asks) errors += fmt("%s%llu %s", errors.empty() ? "" : ", ", PL::ull(n), code.c_str());
    row("in flight when killed", report.caught_in_crash, errors.empty() ? "" : "their asks failed: " + errors);
    row("recovered in Settling", report.recovered_in_settling, "the status query recovered them mid-episode;");
    if (!report.wait_after_recovery_ms.empty()) {
      more(fmt("they had been accepted %.0f ms before (on average) and timed", mean(report.age_at_recovery_ms)));
      more(fmt("out %.0f ms after recovery (max %.0f): the %llu ms deadline counts",
               mean(report.wait_after_recovery_ms),
               *std::max_element(report.wait_after_recovery_ms.begin(), report.wait_after_recovery_ms.end()),
               PL::ull(o.timeout_ms)));
      more("from the stored SettlementAccepted, not from the restart");
    }
    row("had finished, answer lost", report.finished_unseen, "the status query found the stored outcome");
    row("never reached the journal", report.never_stored, "submitted again");
  }

  std::printf("\nsummary\n");
  row("payments", o.payments);
  row("completed", completed);
  row("failed (declined)", declined);
  if (gateway_errors) row("failed (gateway error)", gateway_errors);
  row("timed out", timed_out,
      fmt("no gateway answer within %llu ms (it hung %llu requests)", PL::ull(o.timeout_ms),
          PL::ull(gateway_counters->hung.load())));
  row("cancelled", cancelled, fmt("%llu of them refunded after completion", PL::ull(refunded)));
  if (crash) row("recovered after the crash", report.recovered_in_settling, "in Settling, then timed out");
  row("journal events written", events,
      fmt("%.2f per payment, each log checked against its outcome", static_cast<double>(events) /
                                                                         static_cast<double>(o.payments)));
  auto& lat = report.settle_latency_ms;
  text("client latency, Settle",
       fmt("p50 %.1f ms, p99 %.1f ms, max %.1f ms (%zu answers)", percentile(lat, 0.50), percentile(lat, 0.99),
           lat.empty() ? 0.0 : *std::max_element(lat.begin(), lat.end()), lat.size()));
  text("entity runtime", fmt("%llu incarnations (each recovers from the journal), %llu passivated,",
                             PL::ull(runtime.incarnations_started), PL::ull(runtime.passivations)));
  text("", fmt("%llu processing timeouts, %llu missing replies, %llu handler failures,",
               PL::ull(runtime.processing_timeouts), PL::ull(runtime.missing_replies),
               PL::ull(runtime.handler_failures)));
  text("", fmt("%llu journal failures", PL::ull(runtime.journal_failures + runtime.journal_conflicts)));
  text("final status queries", fmt("%.0f ms (every payment read back through the registry)", query_ms));
  text("wall time", fmt("%.1f s", wall_s));

  // The checks: each failing one makes the exit code non-zero.
  std::uint64_t terminal = completed + declined + gateway_errors + timed_out + cancelled;
  std::vector<std::string> problems;
  if (settling || waiting || unreadable)
    problems.push_back(fmt("%llu stuck in Settling, %llu never settled, %llu unreadable", PL::ull(settling),
                           PL::ull(waiting), PL::ull(unreadable)));
  if (terminal != o.payments)
    problems.push_back(fmt("the outcomes add up to %llu, not %llu", PL::ull(terminal), PL::ull(o.payments)));
  if (mismatched) problems.push_back(fmt("%llu final states differ from what the client was told", PL::ull(mismatched)));
  if (bad_logs) problems.push_back(fmt("%llu logs do not hold the events of their outcome", PL::ull(bad_logs)));
  if (report.recovered_not_timed_out)
    problems.push_back(fmt("%llu payments recovered in Settling did not time out", PL::ull(report.recovered_not_timed_out)));
  if (runtime.missing_replies || runtime.handler_failures || runtime.recovery_failures || runtime.journal_failures)
    problems.push_back("the entity runtime reported failures (see above)");

  std::printf("\n");
  if (problems.empty()) {
    std::printf("check: OK - all %llu payments ended in a terminal state (none stuck in Settling), the outcomes add\n"
                "       up, and every outcome the client was told matches the journal\n",
                PL::ull(o.payments));
  } else {
    for (auto& p : problems) std::printf("check: FAILED - %s\n", p.c_str());
  }

  if (o.keep_db || !problems.empty()) {
    files.keep();
    std::printf("journal kept at %s\n", db.c_str());
  }
  std::fflush(stdout);
  return problems.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Options> o;
  try {
    o = parse_options(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "payment_demo: %s\nrun 'payment_demo --help' for the flags\n", e.what());
    return 2;
  }
  if (!o) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  try {
    return run(*o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "payment_demo: %s\n", e.what());
    return 1;
  }
}
