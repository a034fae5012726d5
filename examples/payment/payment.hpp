#pragma once
// The payment entity: one payment, settled once through the settlement
// gateway, event-sourced in a troupe journal.
//
//   WaitingForRequest --Settle--> Settling --approved--------> Completed --Cancel--> Cancelled (refund)
//          |                         |------declined / error--> Failed
//          |                         `------deadline ---------> Failed (timed out)
//          `--Cancel--> Cancelled
//
// Settling is a *processing* state: the payment waits for the gateway and
// holds back every other request for it. The well-known pitfalls of such a
// state are the runtime's job here, through troupe::Processing:
//  - the deadline counts from the stored SettlementAccepted event, so a
//    payment recovered in Settling after a crash times out at once if its
//    time is up, not a full timeout after the restart (E1);
//  - only the current episode's deadline is ever handled (E2);
//  - the deadline stores SettlementTimedOut, which leaves Settling (E3);
//  - the deadline is cancelled when the gateway answers first (E4);
//  - a graceful stop waits for the episode to end (E6).
// Commands that arrive while Settling (a Cancel, a retried Settle) are
// stashed and handled, in order, once the episode has ended.
//
// Cancel. In WaitingForRequest it cancels the payment. In Settling it waits
// for the outcome. After Completed it is a refund: the payment moves to
// Cancelled with the refunded amount and, in a second processing state
// (Refunding), hands the refund to the durable refund queue; the cancel is
// answered once the queue has accepted it (RefundQueued, with the job id),
// or, if it could not (RefundNotQueued: queue refused, or no answer within
// the deadline), with that failure, and the next Cancel tries again. A
// Cancel meanwhile waits, so a double click queues one refund. After Failed
// there is nothing to undo: the current status is the answer.
//
// Settle is idempotent per payment id: a retry with the same order and amount
// gets the outcome (at once, or when the episode in progress ends); one with
// a different order or amount is refused.
//
// The client's Settle waits for the outcome, not for the acceptance. Its
// reply target cannot be persisted, so the behaviour object keeps it and
// answers it when the episode ends: on the gateway's answer, or in
// on_processing_timeout. After a crash that reply target is gone (the client
// saw its request fail); the client asks again and gets the stored outcome.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "gateway.hpp"
#include "payment_events.pb.h"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"
#include "troupe/protobuf/codecs.hpp"

namespace payment {

enum class Phase : std::uint8_t { waiting_for_request, settling, completed, failed, cancelled };
enum class Failure : std::uint8_t { none, declined, timed_out, gateway_error };

inline const char* to_string(Phase p) {
  switch (p) {
    case Phase::waiting_for_request: return "WaitingForRequest";
    case Phase::settling: return "Settling";
    case Phase::completed: return "Completed";
    case Phase::failed: return "Failed";
    case Phase::cancelled: return "Cancelled";
  }
  return "?";
}

inline const char* to_string(Failure f) {
  switch (f) {
    case Failure::none: return "none";
    case Failure::declined: return "declined";
    case Failure::timed_out: return "timed out";
    case Failure::gateway_error: return "gateway error";
  }
  return "?";
}

// --- state ---------------------------------------------------------------------

// One payment's state, rebuilt from its events. Value type.
struct PaymentState {
  Phase phase = Phase::waiting_for_request;
  Failure failure = Failure::none;
  std::string customer;             // set by Create (empty for a payment settled at once)
  std::string order_id;
  std::int64_t amount = 0;          // minor units (cents)
  std::int64_t accepted_at_ms = 0;  // wall clock, ms since the epoch
  std::string detail;               // authorisation code, or why it failed
  std::int64_t refunded = 0;
  std::uint64_t refund_job = 0;  // the refund queue's job id, once it accepted the refund
  std::string refund_error;      // why the last try to queue the refund failed (empty: none failed)
  std::uint32_t refund_attempt = 0;  // tries to queue it so far: an answer names the try it answers

  // Cancelled after completion, and the refund not yet accepted by the queue
  // nor failed: the Refunding processing state.
  bool refunding() const { return phase == Phase::cancelled && refunded > 0 && refund_job == 0 && refund_error.empty(); }
};

// What every command that asks about a payment gets back. Value type.
struct PaymentStatus {
  PaymentState state;
  std::uint64_t events = 0;  // events stored for this payment so far
};

// --- commands ------------------------------------------------------------------

// Registers the payment (customer, order, amount) without settling it yet;
// answered with the status. Idempotent for the same order and amount.
struct Create {
  std::string customer;
  std::string order_id;
  std::int64_t amount = 0;
  troupe::ReplyTo<PaymentStatus> reply_to;
};
// Settle `amount` for `order_id`; answered with the outcome (Completed or
// Failed). On a created payment the order and amount may be left empty:
// the created ones are settled.
struct Settle {
  std::string order_id;
  std::int64_t amount = 0;
  troupe::ReplyTo<PaymentStatus> reply_to;
  std::string customer;  // recorded with the settlement (optional)
};
// Cancel the payment, or refund it once completed; answered with the new status.
struct Cancel {
  troupe::ReplyTo<PaymentStatus> reply_to;
};
// The current status, at once, even while Settling (a read never waits).
struct GetStatus {
  troupe::ReplyTo<PaymentStatus> reply_to;
};
// The gateway's answer, or why the ask to it failed. Sent by the entity's own ask.
struct GatewayAnswered {
  troupe::Result<GatewayReply> answer;
};
// Asks the refund queue (the service's refund desk actor) to take a refund;
// answered with the job id once the durable queue has accepted it.
struct QueueRefund {
  std::string payment_id;
  std::int64_t amount = 0;
  troupe::ReplyTo<std::uint64_t> reply_to;
};

// The refund queue's answer (the job id), or why the refund was not queued,
// to the try `attempt` (PaymentState::refund_attempt when it was asked).
struct RefundAnswered {
  std::uint32_t attempt = 0;
  troupe::Result<std::uint64_t> job;
};

// How long Refunding waits for the refund queue. Above the cluster-wide
// job service's route_timeout (10 s), so a refund re-routed while queue
// shards move is answered within its episode, not after it (a late
// acceptance would be queued again by the next Cancel).
inline constexpr troupe::Duration kRefundQueueTimeout = std::chrono::seconds(15);
// The payment is finished: free its memory (it recovers on the next command).
struct Rest {};

using Command = std::variant<Create, Settle, Cancel, GetStatus, GatewayAnswered, RefundAnswered, Rest>;

// --- events: each carries what recovery needs to rebuild the state --------------

struct PaymentCreated {
  std::string customer;
  std::string order_id;
  std::int64_t amount = 0;
};
struct SettlementAccepted {
  std::string order_id;
  std::int64_t amount = 0;
  std::int64_t accepted_at_ms = 0;
  std::string customer;  // since version 2
};
struct SettlementSucceeded {
  std::string authorization;
};
struct SettlementDeclined {
  std::string reason;
};
struct SettlementFailed {  // the ask to the gateway failed (e.g. it had stopped)
  std::string reason;
};
struct SettlementTimedOut {  // stored by the runtime at the processing deadline
  std::int64_t timeout_ms = 0;
};
struct PaymentCancelled {
  std::int64_t refunded = 0;  // 0 when cancelled before settling
};
struct RefundQueued {  // the refund queue accepted the refund
  std::uint64_t job = 0;
};
struct RefundNotQueued {  // it refused, or did not answer by the deadline
  std::string reason;
};
struct RefundRetried {};  // a Cancel after RefundNotQueued: queue it again

using Event = std::variant<SettlementAccepted, SettlementSucceeded, SettlementDeclined, SettlementFailed,
                           SettlementTimedOut, PaymentCancelled, PaymentCreated, RefundQueued, RefundNotQueued,
                           RefundRetried>;

// --- the behaviour -------------------------------------------------------------------

// The payment's behaviour: one object per entity incarnation, built by the
// registry's factory. Owns the reply target of the client waiting for the
// current settlement. Used only from its entity's handlers (one at a time).
class Payment {
 public:
  using Command = payment::Command;
  using Event = payment::Event;
  using State = PaymentState;
  using Effect = troupe::Effect<Event, State>;
  using Context = troupe::EntityContext<Payment>;

  Payment(troupe::ActorRef<GatewayMsg> gateway, troupe::ActorRef<QueueRefund> refunds,
          troupe::Duration processing_timeout)
      : gateway_(std::move(gateway)), refunds_(std::move(refunds)), processing_timeout_(processing_timeout) {}

  Effect on_command(const State& s, Command& c, Context& ctx) {
    return troupe::match(
        c, [&](Create& m) { return on_create(s, m, ctx); }, [&](Settle& m) { return on_settle(s, m, ctx); },
        [&](Cancel& m) { return on_cancel(s, m, ctx); },
        [&](GetStatus& m) { return Effect::reply(m.reply_to, PaymentStatus{s, ctx.last_seq()}); },
        [&](GatewayAnswered& m) { return on_gateway_answer(s, m, ctx); },
        [&](RefundAnswered& m) { return on_refund_answer(s, m, ctx); },
        [&](Rest&) { return Effect::passivate(); });
  }

  void on_event(State& s, const Event& e) const {
    troupe::match(
        e,
        [&](const PaymentCreated& x) {
          s.customer = x.customer;
          s.order_id = x.order_id;
          s.amount = x.amount;
        },
        [&](const SettlementAccepted& a) {
          if (!a.customer.empty()) s.customer = a.customer;
          s.phase = Phase::settling;
          s.order_id = a.order_id;
          s.amount = a.amount;
          s.accepted_at_ms = a.accepted_at_ms;
        },
        [&](const SettlementSucceeded& x) {
          s.phase = Phase::completed;
          s.detail = x.authorization;
        },
        [&](const SettlementDeclined& x) { fail(s, Failure::declined, x.reason); },
        [&](const SettlementFailed& x) { fail(s, Failure::gateway_error, x.reason); },
        [&](const SettlementTimedOut& x) {
          fail(s, Failure::timed_out, "no answer from the gateway within " + std::to_string(x.timeout_ms) + " ms");
        },
        [&](const PaymentCancelled& x) {
          s.phase = Phase::cancelled;
          s.refunded = x.refunded;
          if (x.refunded > 0) s.refund_attempt = 1;
        },
        [&](const RefundQueued& x) { s.refund_job = x.job; },
        [&](const RefundNotQueued& x) { s.refund_error = x.reason.empty() ? "refund not queued" : x.reason; },
        [&](const RefundRetried&) {
          s.refund_error.clear();
          ++s.refund_attempt;
        });
  }

  // Settling and Refunding are processing states. Settling's deadline stores
  // SettlementTimedOut; Refunding's stores RefundNotQueued (the queue did not
  // answer: a Cancel tries again).
  std::optional<troupe::Processing<Event>> processing(const State& s) const {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(processing_timeout_).count();
    if (s.phase == Phase::settling) return troupe::Processing<Event>{processing_timeout_, SettlementTimedOut{ms}};
    if (s.refunding()) {
      const auto wait = refund_timeout();
      const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(wait).count();
      return troupe::Processing<Event>{
          wait, RefundNotQueued{"the refund queue did not answer within " + std::to_string(wait_ms) + " ms"}};
    }
    return std::nullopt;
  }

  // The deadline ended the episode (SettlementTimedOut or RefundNotQueued is
  // stored): answer the client that waited for it, then rest like any
  // finished payment.
  void on_processing_timeout(const State& s, Context& ctx) {
    answer_client(s, ctx);
    ctx.tell_self(Rest{});
  }

 private:
  Effect on_create(const State& s, Create& m, Context& ctx) {
    auto bad = [&](std::string why) {
      return Effect::reject(m.reply_to, troupe::Error(troupe::ErrorCode::invalid_argument, std::move(why)));
    };
    if (m.order_id.empty() || m.amount <= 0) return bad("a payment needs an order id and a positive amount");
    if (!s.order_id.empty()) {
      if (m.order_id != s.order_id || m.amount != s.amount)
        return bad("payment already used for order '" + s.order_id + "'");
      return Effect::reply(m.reply_to, PaymentStatus{s, ctx.last_seq()});  // idempotent retry
    }
    if (s.phase != Phase::waiting_for_request) return bad("payment already settled or cancelled");
    auto reply = [&ctx](const State& st) { return PaymentStatus{st, ctx.last_seq()}; };
    return Effect::persist(PaymentCreated{m.customer, m.order_id, m.amount}).then_reply(m.reply_to, reply);
  }

  Effect on_settle(const State& s, Settle& m, Context& ctx) {
    // A created payment settles what it was created with.
    if (!s.order_id.empty() && m.order_id.empty() && m.amount == 0) {
      m.order_id = s.order_id;
      m.amount = s.amount;
    }
    switch (s.phase) {
      case Phase::waiting_for_request: {
        if (!s.order_id.empty() && (m.order_id != s.order_id || m.amount != s.amount))
          return Effect::reject(m.reply_to, troupe::Error(troupe::ErrorCode::invalid_argument,
                                                          "payment already used for order '" + s.order_id + "'"));
        if (m.order_id.empty() || m.amount <= 0)
          return Effect::reject(m.reply_to, troupe::Error(troupe::ErrorCode::invalid_argument,
                                                          "a settlement needs an order id and a positive amount"));
        // Answered when the episode ends, not now (see the file comment).
        client_ = std::move(m.reply_to);
        auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.wall_now().time_since_epoch());
        return Effect::persist(SettlementAccepted{m.order_id, m.amount, now_ms.count(),
                                                  m.customer.empty() ? s.customer : m.customer})
            .then([this, &ctx](const State& st) { ask_gateway(st, ctx); });
      }
      case Phase::settling:
        // One settlement at a time: a retry waits for the outcome.
        return Effect::stash();
      case Phase::completed:
      case Phase::failed:
      case Phase::cancelled:
        if (m.order_id != s.order_id || m.amount != s.amount)
          return Effect::reject(m.reply_to, troupe::Error(troupe::ErrorCode::invalid_argument,
                                                          "payment already used for order '" + s.order_id + "'"));
        return Effect::reply(m.reply_to, PaymentStatus{s, ctx.last_seq()});  // idempotent retry
    }
    return Effect::none();
  }

  Effect on_cancel(const State& s, Cancel& m, Context& ctx) {
    auto reply = [&ctx](const State& st) { return PaymentStatus{st, ctx.last_seq()}; };
    switch (s.phase) {
      case Phase::waiting_for_request:
        return Effect::persist(PaymentCancelled{0}).then_reply(m.reply_to, reply).then_passivate();
      case Phase::settling:
        return Effect::stash();  // what a cancel means depends on the outcome
      case Phase::completed:
        // Answered when the refund queue has answered (see the file comment).
        client_ = std::move(m.reply_to);
        return Effect::persist(PaymentCancelled{s.amount}).then([this, &ctx](const State& st) {
          queue_refund(st, ctx);
        });
      case Phase::cancelled:
        if (s.refunding()) return Effect::stash();  // the refund is being queued: wait for it
        if (!s.refund_error.empty()) {              // the last try failed: try again
          client_ = std::move(m.reply_to);
          return Effect::persist(RefundRetried{}).then([this, &ctx](const State& st) { queue_refund(st, ctx); });
        }
        return Effect::reply(m.reply_to, PaymentStatus{s, ctx.last_seq()});  // nothing more to do
      case Phase::failed:
        return Effect::reply(m.reply_to, PaymentStatus{s, ctx.last_seq()});  // nothing to undo
    }
    return Effect::none();
  }

  Effect on_refund_answer(const State& s, RefundAnswered& m, Context& ctx) {
    // An answer after the deadline: the episode has ended as not queued. (The
    // queue may have taken it after all; a later Cancel queues it again, and
    // the gateway may see the refund twice.)
    // An answer to an earlier try (it came after that try's deadline, and a
    // Cancel has asked again since): not this episode's.
    if (!s.refunding() || m.attempt != s.refund_attempt) return Effect::none();
    Effect e = m.job.ok() ? Effect::persist(RefundQueued{m.job.value()})
                          : Effect::persist(RefundNotQueued{m.job.error().to_string()});
    return std::move(e).then([this, &ctx](const State& st) { answer_client(st, ctx); }).then_passivate();
  }

  void queue_refund(const State& s, Context& ctx) {
    if (!s.refunding()) {  // cancelled before settling: nothing to pay back
      answer_client(s, ctx);
      return;
    }
    ctx.ask<std::uint64_t>(
        refunds_, [&](troupe::ReplyTo<std::uint64_t> r) { return QueueRefund{ctx.id(), s.refunded, std::move(r)}; },
        refund_timeout() + std::chrono::seconds(1),
        [attempt = s.refund_attempt](troupe::Result<std::uint64_t> r) { return RefundAnswered{attempt, std::move(r)}; });
  }

  troupe::Duration refund_timeout() const { return std::max(processing_timeout_, kRefundQueueTimeout); }

  Effect on_gateway_answer(const State& s, GatewayAnswered& m, Context& ctx) {
    // An answer after the deadline: the episode has already ended as timed
    // out, and that is what is stored. (A real system would reconcile.)
    if (s.phase != Phase::settling) return Effect::none();
    Effect e = [&] {
      if (!m.answer.ok()) return Effect::persist(SettlementFailed{m.answer.error().to_string()});
      if (!m.answer->approved) return Effect::persist(SettlementDeclined{m.answer->code});
      return Effect::persist(SettlementSucceeded{m.answer->code});
    }();
    // A finished payment rarely hears from its client again: free it.
    return std::move(e).then([this, &ctx](const State& st) { answer_client(st, ctx); }).then_passivate();
  }

  void ask_gateway(const State& s, Context& ctx) {
    // The ask's own timeout is longer than the processing timeout, so the
    // entity's deadline (stored, recoverable) is what ends a hung request;
    // the ask's timeout then lands after the episode and is ignored.
    ctx.ask<GatewayReply>(
        gateway_,
        [&](troupe::ReplyTo<GatewayReply> r) {
          return GatewayRequest{ctx.id(), s.order_id, s.amount, std::move(r)};
        },
        processing_timeout_ + std::chrono::seconds(1),
        [](troupe::Result<GatewayReply> r) { return GatewayAnswered{std::move(r)}; });
  }

  void answer_client(const State& s, Context& ctx) {
    if (client_.pending()) client_.reply(PaymentStatus{s, ctx.last_seq()});
  }

  static void fail(State& s, Failure f, std::string why) {
    s.phase = Phase::failed;
    s.failure = f;
    s.detail = std::move(why);
  }

  troupe::ActorRef<GatewayMsg> gateway_;
  troupe::ActorRef<QueueRefund> refunds_;
  troupe::Duration processing_timeout_;
  troupe::ReplyTo<PaymentStatus> client_;  // the Settle or Cancel waiting for this episode's outcome
};

// --- codecs: every event as its message in payment_events.proto ---------------------

namespace codec {

inline pb::PaymentCreated to_pb(const PaymentCreated& e) {
  pb::PaymentCreated m;
  m.set_customer(e.customer);
  m.set_order_id(e.order_id);
  m.set_amount(e.amount);
  return m;
}
inline pb::SettlementAccepted to_pb(const SettlementAccepted& e) {
  pb::SettlementAccepted m;
  m.set_order_id(e.order_id);
  m.set_amount(e.amount);
  m.set_accepted_at_ms(e.accepted_at_ms);
  m.set_customer(e.customer);
  return m;
}
inline pb::SettlementSucceeded to_pb(const SettlementSucceeded& e) {
  pb::SettlementSucceeded m;
  m.set_authorization(e.authorization);
  return m;
}
inline pb::SettlementDeclined to_pb(const SettlementDeclined& e) {
  pb::SettlementDeclined m;
  m.set_reason(e.reason);
  return m;
}
inline pb::SettlementFailed to_pb(const SettlementFailed& e) {
  pb::SettlementFailed m;
  m.set_reason(e.reason);
  return m;
}
inline pb::SettlementTimedOut to_pb(const SettlementTimedOut& e) {
  pb::SettlementTimedOut m;
  m.set_timeout_ms(e.timeout_ms);
  return m;
}
inline pb::PaymentCancelled to_pb(const PaymentCancelled& e) {
  pb::PaymentCancelled m;
  m.set_refunded(e.refunded);
  return m;
}
inline pb::RefundQueued to_pb(const RefundQueued& e) {
  pb::RefundQueued m;
  m.set_job(e.job);
  return m;
}
inline pb::RefundNotQueued to_pb(const RefundNotQueued& e) {
  pb::RefundNotQueued m;
  m.set_reason(e.reason);
  return m;
}
inline pb::RefundRetried to_pb(const RefundRetried&) { return {}; }

inline PaymentCreated from_pb(const pb::PaymentCreated& m) {
  return {m.customer(), m.order_id(), m.amount()};
}
inline SettlementAccepted from_pb(const pb::SettlementAccepted& m) {
  return {m.order_id(), m.amount(), m.accepted_at_ms(), m.customer()};
}
inline SettlementSucceeded from_pb(const pb::SettlementSucceeded& m) { return {m.authorization()}; }
inline SettlementDeclined from_pb(const pb::SettlementDeclined& m) { return {m.reason()}; }
inline SettlementFailed from_pb(const pb::SettlementFailed& m) { return {m.reason()}; }
inline SettlementTimedOut from_pb(const pb::SettlementTimedOut& m) { return {m.timeout_ms()}; }
inline PaymentCancelled from_pb(const pb::PaymentCancelled& m) { return {m.refunded()}; }
inline RefundQueued from_pb(const pb::RefundQueued& m) { return {m.job()}; }
inline RefundNotQueued from_pb(const pb::RefundNotQueued& m) { return {m.reason()}; }
inline RefundRetried from_pb(const pb::RefundRetried&) { return {}; }

inline constexpr auto to_message = [](const auto& e) { return to_pb(e); };
inline constexpr auto from_message = [](const auto& m) { return from_pb(m); };

// A row from before payment_events.proto: the ByteWriter layout of event E
// under its bare name, read with `read` into today's message of E.
template <class E, class Read>
void upcast_bytes(troupe::EventCodecs<Event>& c, const char* name, std::uint32_t version, Read read) {
  using Message = decltype(to_pb(std::declval<const E&>()));
  troupe::upcast_from_bytes<Message>(c, name, version,
                                     [read](troupe::ByteReader& r) -> troupe::Result<Message> {
                                       E e = read(r);
                                       return r.finish(to_pb(e));
                                     });
}

}  // namespace codec

inline troupe::EventCodecs<Event> payment_codecs() {
  using codec::from_message;
  using codec::to_message;
  using codec::upcast_bytes;
  using troupe::ByteReader;
  troupe::EventCodecs<Event> c;
  troupe::add_protobuf<PaymentCreated>(c, to_message, from_message);
  troupe::add_protobuf<SettlementAccepted>(c, to_message, from_message);
  troupe::add_protobuf<SettlementSucceeded>(c, to_message, from_message);
  troupe::add_protobuf<SettlementDeclined>(c, to_message, from_message);
  troupe::add_protobuf<SettlementFailed>(c, to_message, from_message);
  troupe::add_protobuf<SettlementTimedOut>(c, to_message, from_message);
  troupe::add_protobuf<PaymentCancelled>(c, to_message, from_message);
  troupe::add_protobuf<RefundQueued>(c, to_message, from_message);
  troupe::add_protobuf<RefundNotQueued>(c, to_message, from_message);
  troupe::add_protobuf<RefundRetried>(c, to_message, from_message);

  // Journals written before: each ByteWriter row is read straight into
  // today's message (a braced list reads its fields in order). Version 2 of
  // SettlementAccepted added the customer; version 1 rows have none.
  upcast_bytes<PaymentCreated>(c, "PaymentCreated", 1, [](ByteReader& r) {
    return PaymentCreated{r.str(), r.str(), r.i64()};
  });
  upcast_bytes<SettlementAccepted>(c, "SettlementAccepted", 1, [](ByteReader& r) {
    return SettlementAccepted{r.str(), r.i64(), r.i64(), ""};
  });
  upcast_bytes<SettlementAccepted>(c, "SettlementAccepted", 2, [](ByteReader& r) {
    return SettlementAccepted{r.str(), r.i64(), r.i64(), r.str()};
  });
  upcast_bytes<SettlementSucceeded>(c, "SettlementSucceeded", 1,
                                    [](ByteReader& r) { return SettlementSucceeded{r.str()}; });
  upcast_bytes<SettlementDeclined>(c, "SettlementDeclined", 1,
                                   [](ByteReader& r) { return SettlementDeclined{r.str()}; });
  upcast_bytes<SettlementFailed>(c, "SettlementFailed", 1,
                                 [](ByteReader& r) { return SettlementFailed{r.str()}; });
  upcast_bytes<SettlementTimedOut>(c, "SettlementTimedOut", 1,
                                   [](ByteReader& r) { return SettlementTimedOut{r.i64()}; });
  upcast_bytes<PaymentCancelled>(c, "PaymentCancelled", 1,
                                 [](ByteReader& r) { return PaymentCancelled{r.i64()}; });
  upcast_bytes<RefundQueued>(c, "RefundQueued", 1, [](ByteReader& r) { return RefundQueued{r.u64()}; });
  upcast_bytes<RefundNotQueued>(c, "RefundNotQueued", 1,
                                [](ByteReader& r) { return RefundNotQueued{r.str()}; });
  upcast_bytes<RefundRetried>(c, "RefundRetried", 1, [](ByteReader&) { return RefundRetried{}; });
  return c;
}

}  // namespace payment
