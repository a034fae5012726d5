#pragma once
// The payment entity: one payment, settled once through the settlement
// gateway, event-sourced in a troupe journal.
//
//   WaitingForRequest --Settle--> Settling --approved--------> Completed --Cancel--> Cancelled (refunded)
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
// for the outcome. After Completed it is a refund: the payment stores
// PaymentCancelled with the refunded amount, and that event calls for one
// "refund" side effect (side_effects below), which the journal stores in the
// same append, in its outbox. The cancel is answered once both are stored;
// the service's outbox dispatcher then pays the refund back through the
// gateway, retried until it succeeds, with the record's idempotency key so
// the gateway pays it once (troupe/persist/outbox.hpp). A crash between the
// two cannot lose it: the refund is in the journal before anyone is told.
// A Cancel of a cancelled payment stores nothing and so sends nothing: the
// current status is the answer, so a double click (or ten) refunds once.
// After Failed there is nothing to undo either.
//
// Expiry. With an ExpiryPolicy (expiry.hpp), Create stores a one-shot
// reminder "expire" due expire_after later, before it stores
// PaymentCreated (so a created payment always has one), and answers once
// both are stored. When it fires (the Expire command), a payment still
// created (WaitingForRequest with an order) stores PaymentCancelled with
// reason "expired"; in any other state it stores nothing and answers its
// status, so a late or repeated firing is harmless. A Settle or Cancel of a
// created payment cancels the reminder (without waiting: should that be
// lost, the firing finds the payment settled or cancelled and does nothing).
//
// Settle is idempotent per payment id: a retry with the same order and amount
// gets the outcome (at once, or when the episode in progress ends); one with
// a different order or amount is refused.
//
// Settle is a coroutine handler (troupe::Effect::await, doc/coroutines.md):
// it stores SettlementAccepted, which enters Settling, awaits the gateway,
// and stores the outcome, top to bottom. The client's Settle waits for the
// outcome, not for the acceptance. Its reply target cannot be persisted, so
// once Settling is stored the behaviour object keeps it and answers it when
// the episode ends: when the handler stores the outcome, or in
// on_processing_timeout if the deadline comes first (the runtime then
// destroys the waiting handler, so a late gateway answer is never acted on,
// E2). After a crash that reply target is gone (the client saw its request
// fail); the client asks again and gets the stored outcome.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

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
  std::int64_t refunded = 0;       // paid back on cancel (minor units); 0: nothing to pay back
};

// The reminder a created payment sets to expire itself (expiry.hpp).
inline constexpr const char* kExpireReminder = "expire";
inline constexpr const char* kExpiredReason = "expired";

// When a payment created and never settled expires: `after` its creation,
// through `reminders`. No handle or a zero time: never. Value type; the
// handle is thread-safe.
struct ExpiryPolicy {
  troupe::Reminders reminders;
  troupe::Duration after{};
  bool enabled() const { return static_cast<bool>(reminders) && after > troupe::Duration::zero(); }
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
// The payment is finished: free its memory (it recovers on the next command).
struct Rest {};
// Its "expire" reminder fired (due at due_ms): cancel it if still created;
// answered with the status either way.
struct Expire {
  std::int64_t due_ms = 0;
  troupe::ReplyTo<PaymentStatus> reply_to;
};

using Command = std::variant<Create, Settle, Cancel, GetStatus, Rest, Expire>;

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
  std::int64_t refunded = 0;  // 0 when cancelled before settling; above 0 it calls for a refund
  std::string reason;         // "" when asked for; kExpiredReason when it expired
};

// What builds before the outbox stored about handing a refund to their
// refund queue (the rows RefundQueued, RefundNotQueued and RefundRetried):
// read from old journals so that they still replay, never written, and
// ignored by the state (such a refund was that queue's to pay).
struct LegacyRefundStep {
  std::string what;  // "queued as job 41", "not queued: <why>", "retried"
};

using Event = std::variant<SettlementAccepted, SettlementSucceeded, SettlementDeclined, SettlementFailed,
                           SettlementTimedOut, PaymentCancelled, PaymentCreated, LegacyRefundStep>;

// The side effect a refund is: kind kRefundEffect, the amount in minor
// units as decimal text; the payment is the record's entity id.
inline constexpr const char* kRefundEffect = "refund";

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

  // `slice_tag`: the tag stored with each of the payment's events, the
  // read side's slice of it (read_side.hpp); empty: none.
  // `expiry`: when a created payment expires (none by default).
  Payment(troupe::ActorRef<GatewayMsg> gateway, troupe::Duration processing_timeout, std::string slice_tag = {},
          ExpiryPolicy expiry = {})
      : gateway_(std::move(gateway)),
        processing_timeout_(processing_timeout),
        slice_tag_(std::move(slice_tag)),
        expiry_(std::move(expiry)) {}

  Effect on_command(const State& s, Command& c, Context& ctx) {
    return troupe::match(
        c, [&](Create& m) { return on_create(s, m, ctx); }, [&](Settle& m) { return on_settle(s, m, ctx); },
        [&](Cancel& m) { return on_cancel(s, m, ctx); },
        [&](GetStatus& m) { return Effect::reply(m.reply_to, PaymentStatus{s, ctx.last_seq()}); },
        [&](Rest&) { return Effect::passivate(); }, [&](Expire& m) { return on_expire(s, m, ctx); });
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
          if (!x.reason.empty()) s.detail = x.reason;
        },
        [&](const LegacyRefundStep&) {});
  }

  // The refund a cancel after completion calls for, stored with the event
  // in the journal's outbox and paid by the service's outbox dispatcher.
  std::vector<troupe::SideEffect> side_effects(const Event& e) const {
    const auto* c = std::get_if<PaymentCancelled>(&e);
    if (c == nullptr || c->refunded <= 0) return {};
    return {troupe::SideEffect{kRefundEffect, std::to_string(c->refunded)}};
  }

  // Every event carries the payment's slice tag, so that the read side's
  // projections can split the payments between them (read_side.hpp).
  std::vector<std::string> tags(const Event&) const {
    if (slice_tag_.empty()) return {};
    return {slice_tag_};
  }

  // Settling is a processing state; its deadline stores SettlementTimedOut.
  std::optional<troupe::Processing<Event>> processing(const State& s) const {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(processing_timeout_).count();
    if (s.phase == Phase::settling) return troupe::Processing<Event>{processing_timeout_, SettlementTimedOut{ms}};
    return std::nullopt;
  }

  // The deadline ended the episode (SettlementTimedOut is stored): answer
  // the client that waited for it, then rest like any finished payment.
  void on_processing_timeout(const State& s, Context& ctx) {
    answer_client(s, ctx);
    ctx.tell_self(Rest{});
  }

 private:
  // `reminder_stored`: the expiry's reminder is stored (create_expiring).
  Effect on_create(const State& s, Create& m, Context& ctx, bool reminder_stored = false) {
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
    if (expiry_.enabled() && !reminder_stored) return Effect::await(create_expiring(s, m, ctx));
    auto reply = [&ctx](const State& st) { return PaymentStatus{st, ctx.last_seq()}; };
    return Effect::persist(PaymentCreated{m.customer, m.order_id, m.amount}).then_reply(m.reply_to, reply);
  }

  // Stores the "expire" reminder, then PaymentCreated: a payment whose
  // creation was stored has its reminder; one whose append failed has a
  // reminder that will find nothing to expire. The entity handles other
  // commands meanwhile, so the create is checked again on the state as it
  // is then. `s` and `m` stay valid until this returns.
  troupe::Task<Effect> create_expiring(const State& s, Create& m, Context& ctx) {
    auto stored = expiry_.reminders.set(ctx.persistence_id(), kExpireReminder, ctx.wall_now() + expiry_.after);
    troupe::Result<void> set = co_await std::move(stored);
    if (!set.ok())
      co_return Effect::reject(m.reply_to,
                               troupe::Error(set.error().code(), "the payment's expiry: " + set.error().message()));
    co_return on_create(s, m, ctx, true);
  }

  // Only a payment still created expires; anything else is left as it is.
  Effect on_expire(const State& s, Expire& m, Context& ctx) {
    auto reply = [&ctx](const State& st) { return PaymentStatus{st, ctx.last_seq()}; };
    if (s.phase != Phase::waiting_for_request || s.order_id.empty())
      return Effect::reply(m.reply_to, PaymentStatus{s, ctx.last_seq()});
    return Effect::persist(PaymentCancelled{0, kExpiredReason}).then_reply(m.reply_to, reply).then_passivate();
  }

  // A created payment that settles or is cancelled no longer expires. Not
  // awaited: a firing that comes anyway does nothing (on_expire).
  void drop_expiry(const State& s, Context& ctx) const {
    if (expiry_.reminders && !s.order_id.empty()) (void)expiry_.reminders.cancel(ctx.persistence_id(), kExpireReminder);
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
        drop_expiry(s, ctx);
        return Effect::await(settle(s, m, ctx));
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
        drop_expiry(s, ctx);
        return Effect::persist(PaymentCancelled{0, ""}).then_reply(m.reply_to, reply).then_passivate();
      case Phase::settling:
        return Effect::stash();  // what a cancel means depends on the outcome
      case Phase::completed:
        // The refund is stored with the event (side_effects): answered once both are.
        return Effect::persist(PaymentCancelled{s.amount, ""}).then_reply(m.reply_to, reply).then_passivate();
      case Phase::cancelled:
        return Effect::reply(m.reply_to, PaymentStatus{s, ctx.last_seq()});  // done already: nothing more to send
      case Phase::failed:
        return Effect::reply(m.reply_to, PaymentStatus{s, ctx.last_seq()});  // nothing to undo
    }
    return Effect::none();
  }

  // Settles a payment waiting for its request: stores SettlementAccepted
  // (Settling), asks the gateway, stores the outcome. `s` is the payment's
  // state as it is now; `m` stays valid until this returns.
  troupe::Task<Effect> settle(const State& s, Settle& m, Context& ctx) {
    // Answered when the episode ends, not now: by this handler, or by
    // on_processing_timeout if the deadline comes first (see the file comment).
    client_ = std::move(m.reply_to);
    auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.wall_now().time_since_epoch());
    auto accepted = ctx.persist(
        SettlementAccepted{m.order_id, m.amount, now_ms.count(), m.customer.empty() ? s.customer : m.customer});
    // A failed append stops the payment before this could resume.
    if (!(co_await std::move(accepted)).ok()) co_return Effect::none();
    // The ask's own timeout is longer than the processing timeout, so the
    // entity's deadline (stored, recoverable) is what ends a hung request.
    troupe::Result<GatewayReply> answer = co_await ctx.ask<GatewayReply>(
        gateway_,
        [&](troupe::ReplyTo<GatewayReply> r) {
          return GatewayRequest{ctx.id(), s.order_id, s.amount, std::move(r)};
        },
        processing_timeout_ + std::chrono::seconds(1));
    Effect outcome = !answer.ok()           ? Effect::persist(SettlementFailed{answer.error().to_string()})
                     : !answer->approved    ? Effect::persist(SettlementDeclined{answer->code})
                                            : Effect::persist(SettlementSucceeded{answer->code});
    // A finished payment rarely hears from its client again: free it.
    co_return std::move(outcome).then([this, &ctx](const State& st) { answer_client(st, ctx); }).then_passivate();
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
  troupe::Duration processing_timeout_;
  std::string slice_tag_;
  ExpiryPolicy expiry_;
  troupe::ReplyTo<PaymentStatus> client_;  // the Settle waiting for this episode's outcome
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
  m.set_reason(e.reason);
  return m;
}
inline pb::LegacyRefundStep to_pb(const LegacyRefundStep& e) {
  pb::LegacyRefundStep m;
  m.set_what(e.what);
  return m;
}

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
inline PaymentCancelled from_pb(const pb::PaymentCancelled& m) { return {m.refunded(), m.reason()}; }
inline LegacyRefundStep from_pb(const pb::LegacyRefundStep& m) { return {m.what()}; }

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
  troupe::add_protobuf<LegacyRefundStep>(c, to_message, from_message);  // read, never written

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
                                 [](ByteReader& r) { return PaymentCancelled{r.i64(), ""}; });
  // The refund queue's events of the builds before the outbox.
  upcast_bytes<LegacyRefundStep>(c, "RefundQueued", 1, [](ByteReader& r) {
    return LegacyRefundStep{"queued as job " + std::to_string(r.u64())};
  });
  upcast_bytes<LegacyRefundStep>(c, "RefundNotQueued", 1,
                                 [](ByteReader& r) { return LegacyRefundStep{"not queued: " + r.str()}; });
  upcast_bytes<LegacyRefundStep>(c, "RefundRetried", 1,
                                 [](ByteReader&) { return LegacyRefundStep{"retried"}; });
  return c;
}

}  // namespace payment
