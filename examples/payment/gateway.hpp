#pragma once
// A simulated settlement gateway: the external system a payment waits on.
//
// It answers each request after a configurable latency (mean ± uniform
// jitter), declines a configurable share of them, and never answers another
// share at all ("hangs"): the requests a real gateway loses behind a broken
// connection. A hung request's reply target is kept, not dropped — dropping
// it would answer the asker at once with no_reply, which is exactly what a
// hung gateway does not do. The asker's own deadline is what ends the wait.
//
// The latency is an actor timer per request, so the gateway never sleeps and
// one actor serves any number of requests at once.

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/core.hpp"

namespace payment {

// The gateway's answer: approved with an authorisation code, or declined
// with a reason. Value type.
struct GatewayReply {
  bool approved = false;
  std::string code;  // authorisation code, or the reason of a decline
};

// "Settle `amount` for `order_id`"; the answer goes to `reply_to`. Move-only
// (it owns the reply target).
struct GatewayRequest {
  std::string payment_id;
  std::string order_id;
  std::int64_t amount = 0;  // minor units (cents)
  troupe::ReplyTo<GatewayReply> reply_to;
};

// The gateway's own latency timer for one request has elapsed. Only the
// gateway sends this (to itself).
struct GatewayAnswerDue {
  troupe::ReplyTo<GatewayReply> reply_to;
  GatewayReply reply;
};

using GatewayMsg = std::variant<GatewayRequest, GatewayAnswerDue>;

struct GatewaySettings {
  troupe::Duration latency_mean = std::chrono::milliseconds(20);
  troupe::Duration latency_jitter = std::chrono::milliseconds(10);  // uniform in [mean - jitter, mean + jitter]
  double decline_rate = 0.05;
  double hang_rate = 0.02;
  std::uint64_t seed = 1;
};

// What the gateway decided, for the demo's report. Written by the gateway
// actor, read by anyone: every member is atomic.
struct GatewayCounters {
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> approved{0};
  std::atomic<std::uint64_t> declined{0};
  std::atomic<std::uint64_t> hung{0};
};

// The simulated gateway. One actor; owns the reply targets of the requests
// it holds (answered when their timer fires, or held until it stops if it
// "hung" them). Thread-safety: an actor, reached only through its ref.
class SettlementGateway final : public troupe::Actor<GatewayMsg> {
 public:
  SettlementGateway(GatewaySettings settings, std::shared_ptr<GatewayCounters> counters)
      : settings_(settings), counters_(std::move(counters)), rng_(settings.seed) {}

  void receive(GatewayMsg& m) {
    troupe::match(
        m, [&](GatewayRequest& r) { accept(r); },
        [&](GatewayAnswerDue& d) { d.reply_to.reply(std::move(d.reply)); });
  }

 private:
  void accept(GatewayRequest& r) {
    counters_->requests.fetch_add(1, std::memory_order_relaxed);
    double u = unit_(rng_);
    if (u < settings_.hang_rate) {
      counters_->hung.fetch_add(1, std::memory_order_relaxed);
      hung_.push_back(std::move(r.reply_to));  // held, never answered
      return;
    }
    GatewayReply reply;
    if (u < settings_.hang_rate + settings_.decline_rate) {
      counters_->declined.fetch_add(1, std::memory_order_relaxed);
      reply = GatewayReply{false, "declined by issuer"};
    } else {
      counters_->approved.fetch_add(1, std::memory_order_relaxed);
      char code[24];
      std::snprintf(code, sizeof code, "AUTH-%08llX", static_cast<unsigned long long>(rng_() & 0xffffffffu));
      reply = GatewayReply{true, code};
    }
    // One timer per request, under its own key: requests overlap freely.
    start_timer("answer-" + std::to_string(++next_key_), latency(),
                GatewayAnswerDue{std::move(r.reply_to), std::move(reply)});
  }

  troupe::Duration latency() {
    auto mean = settings_.latency_mean.count();
    auto jitter = settings_.latency_jitter.count();
    auto d = mean + static_cast<std::int64_t>((unit_(rng_) * 2.0 - 1.0) * static_cast<double>(jitter));
    return troupe::Duration(d > 0 ? d : 0);
  }

  GatewaySettings settings_;
  std::shared_ptr<GatewayCounters> counters_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> unit_{0.0, 1.0};
  std::uint64_t next_key_ = 0;
  std::vector<troupe::ReplyTo<GatewayReply>> hung_;
};

}  // namespace payment
