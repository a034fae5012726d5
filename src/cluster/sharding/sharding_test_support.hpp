#pragma once
// A small entity for the sharding tests: an account that keeps a balance and
// a log of (node, incarnation, seq) marks — the history the multi-node tests
// check for double activation — and can enter a processing state (a
// settlement) that only an explicit Finish or its timeout ends.

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "troupe/cluster/messages.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"

namespace troupe::cluster::test {

// Commands
struct Deposit {  // answers the new balance
  std::int64_t amount = 0;
  ReplyTo<std::int64_t> reply_to;
};
struct Where {  // answers "<node> <entity id> <balance>"
  ReplyTo<std::string> reply_to;
};
struct Mark {  // one-way: persists a mark with the sender's sequence number
  std::int64_t seq = 0;
};
struct Marks {  // answers the marks as "seq,seq,..."
  ReplyTo<std::string> reply_to;
};
struct StartSettle {  // enters processing; answers "settling"
  ReplyTo<std::string> reply_to;
};
struct Finish {};  // leaves processing
using AccountCmd = std::variant<Deposit, Where, Mark, Marks, StartSettle, Finish>;

// Events
struct Deposited {
  std::int64_t amount = 0;
};
struct Marked {
  std::int64_t seq = 0;
};
struct SettleStarted {};
struct SettleEnded {};
struct SettleTimedOut {};
using AccountEvent = std::variant<Deposited, Marked, SettleStarted, SettleEnded, SettleTimedOut>;

struct AccountState {
  std::int64_t balance = 0;
  std::string marks;
  bool settling = false;
};

struct Account {
  using Command = AccountCmd;
  using Event = AccountEvent;
  using State = AccountState;
  using Effect = troupe::Effect<Event, State>;

  std::string node;
  Duration settle_timeout = std::chrono::seconds(30);
  // While settling, Deposit and Where wait (stashed) for the episode's end:
  // asks that stay out on the wire until a Finish.
  bool hold_while_settling = false;

  Effect on_command(const State& s, Command& c, EntityContext<Account>& ctx) {
    return std::visit(
        [&](auto& m) -> Effect {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, Deposit> || std::is_same_v<T, Where>) {
            if (hold_while_settling && s.settling) return Effect::stash();
          }
          if constexpr (std::is_same_v<T, Deposit>) {
            return Effect::persist(Deposited{m.amount}).then_reply(m.reply_to, [](const State& st) { return st.balance; });
          } else if constexpr (std::is_same_v<T, Where>) {
            return Effect::reply(m.reply_to, node + " " + ctx.id() + " " + std::to_string(s.balance));
          } else if constexpr (std::is_same_v<T, Mark>) {
            return Effect::persist(Marked{m.seq});
          } else if constexpr (std::is_same_v<T, Marks>) {
            return Effect::reply(m.reply_to, s.marks);
          } else if constexpr (std::is_same_v<T, StartSettle>) {
            if (s.settling) return Effect::reply(m.reply_to, std::string("settling"));
            return Effect::persist(SettleStarted{}).then_reply(m.reply_to, [] { return std::string("settling"); });
          } else {
            if (!s.settling) return Effect::none();
            return Effect::persist(SettleEnded{});
          }
        },
        c);
  }
  void on_event(State& s, const Event& e) {
    std::visit(
        [&](const auto& ev) {
          using T = std::decay_t<decltype(ev)>;
          if constexpr (std::is_same_v<T, Deposited>) {
            s.balance += ev.amount;
          } else if constexpr (std::is_same_v<T, Marked>) {
            if (!s.marks.empty()) s.marks += ',';
            s.marks += std::to_string(ev.seq);
          } else if constexpr (std::is_same_v<T, SettleStarted>) {
            s.settling = true;
          } else {
            s.settling = false;
          }
        },
        e);
  }
  std::optional<Processing<Event>> processing(const State& s) const {
    if (!s.settling) return std::nullopt;
    return Processing<Event>{settle_timeout, SettleTimedOut{}};
  }
};

inline EventCodecs<AccountEvent> account_events() {
  EventCodecs<AccountEvent> c;
  c.add<Deposited>(
      "Deposited", 1, [](const Deposited& e, ByteWriter& w) { w.i64(e.amount); },
      [](std::uint32_t, ByteReader& r) -> Result<Deposited> {
        Deposited e;
        e.amount = r.i64();
        return r.finish(e);
      });
  c.add<Marked>(
      "Marked", 1, [](const Marked& e, ByteWriter& w) { w.i64(e.seq); },
      [](std::uint32_t, ByteReader& r) -> Result<Marked> {
        Marked e;
        e.seq = r.i64();
        return r.finish(e);
      });
  c.add<SettleStarted>(
      "SettleStarted", 1, [](const SettleStarted&, ByteWriter&) {},
      [](std::uint32_t, ByteReader& r) { return r.finish(SettleStarted{}); });
  c.add<SettleEnded>(
      "SettleEnded", 1, [](const SettleEnded&, ByteWriter&) {},
      [](std::uint32_t, ByteReader& r) { return r.finish(SettleEnded{}); });
  c.add<SettleTimedOut>(
      "SettleTimedOut", 1, [](const SettleTimedOut&, ByteWriter&) {},
      [](std::uint32_t, ByteReader& r) { return r.finish(SettleTimedOut{}); });
  return c;
}

// `where`: how Where is registered (idempotent for the failover tests).
inline MessageCodecs<AccountCmd> account_commands(MessageOptions where = {}) {
  MessageCodecs<AccountCmd> c;
  auto str_enc = [](const std::string& v, ByteWriter& w) { w.str(v); };
  auto str_dec = [](ByteReader& r) -> Result<std::string> {
    std::string v = r.str();
    return r.finish(std::move(v));
  };
  auto i64_enc = [](const std::int64_t& v, ByteWriter& w) { w.i64(v); };
  auto i64_dec = [](ByteReader& r) -> Result<std::int64_t> {
    std::int64_t v = r.i64();
    return r.finish(v);
  };
  (void)c.add<Deposit>(
      "Deposit", [](const Deposit& m, ByteWriter& w) { w.i64(m.amount); },
      [](ByteReader& r) -> Result<Deposit> {
        Deposit m;
        m.amount = r.i64();
        return r.finish(std::move(m));
      },
      i64_enc, i64_dec);
  (void)c.add<Where>(
      "Where", [](const Where&, ByteWriter&) {}, [](ByteReader& r) -> Result<Where> { return r.finish(Where{}); },
      str_enc, str_dec, where);
  (void)c.add<Mark>(
      "Mark", [](const Mark& m, ByteWriter& w) { w.i64(m.seq); },
      [](ByteReader& r) -> Result<Mark> {
        Mark m;
        m.seq = r.i64();
        return r.finish(m);
      });
  (void)c.add<Marks>(
      "Marks", [](const Marks&, ByteWriter&) {}, [](ByteReader& r) -> Result<Marks> { return r.finish(Marks{}); },
      str_enc, str_dec);
  (void)c.add<StartSettle>(
      "StartSettle", [](const StartSettle&, ByteWriter&) {},
      [](ByteReader& r) -> Result<StartSettle> { return r.finish(StartSettle{}); }, str_enc, str_dec);
  (void)c.add<Finish>(
      "Finish", [](const Finish&, ByteWriter&) {}, [](ByteReader& r) -> Result<Finish> { return r.finish(Finish{}); });
  return c;
}

}  // namespace troupe::cluster::test
