// The payment demo's client, the shop's checkout: see demo_checkout.hpp.

#include "demo_checkout.hpp"

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>

namespace payment_demo {

namespace {

using namespace std::chrono_literals;
using payment::Failure;
using payment::Phase;

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
    // Long enough that the entity's own deadline always answers first (a
    // Cancel waits at most for a settlement in progress).
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

}  // namespace

troupe::ActorRef<CheckoutMsg> spawn_checkout(troupe::ActorSystem& system, const Options& o,
                                             std::shared_ptr<Progress> progress) {
  return system.spawn<Checkout>(troupe::SpawnOptions{.name = "checkout"}, o, std::move(progress));
}

}  // namespace payment_demo
