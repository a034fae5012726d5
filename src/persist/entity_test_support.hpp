#pragma once
// A small payment entity for the entity tests: the seed-000 flow
// (waiting -> settling (processing) -> completed / failed, plus cancel) with a
// gateway the test plays through a TestProbe, and a few extra commands that
// let tests observe the runtime.

#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "troupe/core.hpp"
#include "troupe/persist.hpp"
#include "troupe/testkit/gate.hpp"
#include "troupe/testkit/probe.hpp"

namespace troupe::test {

// To the gateway: settle `amount` for `id`, answer true (settled) or false.
struct GatewayRequest {
  std::string id;
  std::int64_t amount = 0;
  ReplyTo<bool> reply_to;
};

// Commands
struct Settle {
  std::int64_t amount = 0;
  ReplyTo<std::string> reply_to;
};
struct GatewayResult {
  bool ok = false;
  std::string error;  // non-empty when the ask itself failed
};
struct Cancel {
  ReplyTo<std::string> reply_to;
};
struct GetState {
  ReplyTo<std::string> reply_to;
};
struct Note {  // fire and forget: persists Noted
  std::string text;
};
struct Forget {  // handled without replying: the runtime must answer
  ReplyTo<std::string> reply_to;
};
struct Boom {};  // the handler throws
struct Sleep {   // asks for passivation
  ReplyTo<std::string> reply_to;
};
// While settling: declines the episode and enters a new one for `amount`,
// both events in one append (the episode ends and the next begins at once).
struct Retry {
  std::int64_t amount = 0;
  ReplyTo<std::string> reply_to;
};
// Holds the incarnation's thread inside the handler: opens `entered`, then
// waits for `release` (bounded by Gate::wait). Fire and forget.
struct Hold {
  std::shared_ptr<testkit::Gate> entered;
  std::shared_ptr<testkit::Gate> release;
};
using PayCmd = std::variant<Settle, GatewayResult, Cancel, GetState, Note, Forget, Boom, Sleep, Retry, Hold>;

// Events
struct Accepted {
  std::int64_t amount = 0;
};
struct Completed {};
struct Declined {
  std::string reason;
};
struct TimedOut {};
struct Cancelled {};
struct Noted {
  std::string text;
};
using PayEvent = std::variant<Accepted, Completed, Declined, TimedOut, Cancelled, Noted>;

enum class Phase { waiting, settling, completed, failed, cancelled };

struct PayState {
  Phase phase = Phase::waiting;
  std::int64_t amount = 0;
  int notes = 0;
  std::string last_note;
  int timeouts = 0;
};

inline const char* phase_name(Phase p) {
  switch (p) {
    case Phase::waiting: return "waiting";
    case Phase::settling: return "settling";
    case Phase::completed: return "completed";
    case Phase::failed: return "failed";
    case Phase::cancelled: return "cancelled";
  }
  return "?";
}

// "settling amount=5 notes=2 timeouts=0"
inline std::string describe(const PayState& s) {
  return std::string(phase_name(s.phase)) + " amount=" + std::to_string(s.amount) +
         " notes=" + std::to_string(s.notes) + " timeouts=" + std::to_string(s.timeouts);
}

struct Pay {
  using Command = PayCmd;
  using Event = PayEvent;
  using State = PayState;
  using Effect = troupe::Effect<Event, State>;

  ActorRef<GatewayRequest> gateway;
  Duration processing_timeout = std::chrono::seconds(15);

  Effect on_command(const State& s, Command& c, EntityContext<Pay>& ctx) {
    return match(
        c,
        [&](Settle& m) -> Effect {
          if (s.phase == Phase::settling) return Effect::stash();
          if (s.phase != Phase::waiting) return Effect::reply(m.reply_to, std::string("refused: ") + phase_name(s.phase));
          std::int64_t amount = m.amount;
          return Effect::persist(Accepted{amount})
              .then_reply(m.reply_to, [](const State& st) { return "accepted " + std::to_string(st.amount); })
              .then([&ctx, gw = gateway, amount] { ask_gateway(ctx, gw, amount); });
        },
        [&](Retry& m) -> Effect {
          if (s.phase != Phase::settling) return Effect::reply(m.reply_to, std::string("refused: ") + phase_name(s.phase));
          std::int64_t amount = m.amount;
          return Effect::persist(std::vector<Event>{Declined{"retried"}, Accepted{amount}})
              .then_reply(m.reply_to, [](const State& st) { return "retrying " + std::to_string(st.amount); })
              .then([&ctx, gw = gateway, amount] { ask_gateway(ctx, gw, amount); });
        },
        [&](Hold& m) -> Effect {
          m.entered->open();
          (void)m.release->wait();
          return Effect::none();
        },
        [&](GatewayResult& m) -> Effect {
          if (s.phase != Phase::settling) return Effect::none();  // late answer: the episode is over
          if (m.ok) return Effect::persist(Completed{});
          return Effect::persist(Declined{m.error.empty() ? "declined" : m.error});
        },
        [&](Cancel& m) -> Effect {
          if (s.phase == Phase::settling) return Effect::stash();
          if (s.phase != Phase::waiting) return Effect::reply(m.reply_to, std::string("too late: ") + phase_name(s.phase));
          return Effect::persist(Cancelled{}).then_reply(m.reply_to, [] { return std::string("cancelled"); });
        },
        [&](GetState& m) -> Effect { return Effect::reply(m.reply_to, describe(s)); },
        [&](Note& m) -> Effect {
          if (s.phase == Phase::settling) return Effect::stash();
          return Effect::persist(Noted{m.text});
        },
        [&](Forget&) -> Effect { return Effect::none(); },
        [&](Boom&) -> Effect { throw std::runtime_error("boom"); },
        [&](Sleep& m) -> Effect { return Effect::reply(m.reply_to, std::string("sleeping")).then_passivate(); });
  }

  void on_event(State& s, const Event& e) {
    match(
        e, [&](const Accepted& a) { s.phase = Phase::settling, s.amount = a.amount; },
        [&](const Completed&) { s.phase = Phase::completed; },
        [&](const Declined&) { s.phase = Phase::failed; },
        [&](const TimedOut&) { s.phase = Phase::failed, ++s.timeouts; },
        [&](const Cancelled&) { s.phase = Phase::cancelled; },
        [&](const Noted& n) {
          if (n.text == "poison") throw std::runtime_error("poisoned event");
          ++s.notes, s.last_note = n.text;
        });
  }

  static void ask_gateway(EntityContext<Pay>& ctx, const ActorRef<GatewayRequest>& gw, std::int64_t amount) {
    ctx.ask<bool>(
        gw, [&](ReplyTo<bool> r) { return GatewayRequest{ctx.id(), amount, std::move(r)}; }, std::chrono::hours(1),
        [](Result<bool> r) -> Command {
          if (!r.ok()) return GatewayResult{false, r.error().to_string()};
          return GatewayResult{*r, {}};
        });
  }

  std::optional<Processing<Event>> processing(const State& s) const {
    if (s.phase != Phase::settling) return std::nullopt;
    return Processing<Event>{processing_timeout, TimedOut{}};
  }
};

inline EventCodecs<PayEvent> pay_codecs() {
  EventCodecs<PayEvent> c;
  c.add<Accepted>(
      "Accepted", 1, [](const Accepted& e, ByteWriter& w) { w.i64(e.amount); },
      [](std::uint32_t, ByteReader& r) -> Result<Accepted> {
        Accepted e;
        e.amount = r.i64();
        return r.finish(std::move(e));
      });
  c.add<Completed>(
      "Completed", 1, [](const Completed&, ByteWriter&) {},
      [](std::uint32_t, ByteReader& r) { return r.finish(Completed{}); });
  c.add<Declined>(
      "Declined", 1, [](const Declined& e, ByteWriter& w) { w.str(e.reason); },
      [](std::uint32_t, ByteReader& r) -> Result<Declined> {
        Declined e;
        e.reason = r.str();
        return r.finish(std::move(e));
      });
  c.add<TimedOut>(
      "TimedOut", 1, [](const TimedOut&, ByteWriter&) {},
      [](std::uint32_t, ByteReader& r) { return r.finish(TimedOut{}); });
  c.add<Cancelled>(
      "Cancelled", 1, [](const Cancelled&, ByteWriter&) {},
      [](std::uint32_t, ByteReader& r) { return r.finish(Cancelled{}); });
  c.add<Noted>(
      "Noted", 1, [](const Noted& e, ByteWriter& w) { w.str(e.text); },
      [](std::uint32_t, ByteReader& r) -> Result<Noted> {
        Noted e;
        e.text = r.str();
        return r.finish(std::move(e));
      });
  return c;
}

inline StateCodec<PayState> pay_state_codec() {
  StateCodec<PayState> c;
  c.type = "PayState";
  c.version = 1;
  c.encode = [](const PayState& s, ByteWriter& w) {
    w.u8(static_cast<std::uint8_t>(s.phase)).i64(s.amount).u32(static_cast<std::uint32_t>(s.notes)).str(s.last_note);
    w.u32(static_cast<std::uint32_t>(s.timeouts));
  };
  c.decode = [](std::uint32_t, ByteReader& r) -> Result<PayState> {
    PayState s;
    s.phase = static_cast<Phase>(r.u8());
    s.amount = r.i64();
    s.notes = static_cast<int>(r.u32());
    s.last_note = r.str();
    s.timeouts = static_cast<int>(r.u32());
    return r.finish(std::move(s));
  };
  return c;
}

}  // namespace troupe::test
