#pragma once
// The payment demo's client: the shop's checkout, an actor that submits the
// payments and waits for their outcomes across the crash, and what it
// tells main (the progress counters and, at the end, its report).

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "demo.hpp"
#include "demo_service.hpp"

namespace payment_demo {

using payment::PaymentStatus;

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

// Spawns the checkout in `system` (the outside world, which outlives the
// crash). It waits for Start before it submits anything.
troupe::ActorRef<CheckoutMsg> spawn_checkout(troupe::ActorSystem& system, const Options& o,
                                             std::shared_ptr<Progress> progress);

}  // namespace payment_demo
