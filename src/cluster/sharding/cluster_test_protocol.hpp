#pragma once
// What the multi-process cluster tests and their node processes share: the
// ledger entity's commands and events with their codecs, and the control
// requests the test driver sends each node's "ctl" actor.

#include <cstdint>
#include <map>
#include <string>
#include <variant>

#include "troupe/cluster/messages.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"

namespace troupe::cluster::proc {

inline constexpr const char* kLedgerType = "ledger";

// --- the ledger entity ----------------------------------------------------------

struct Deposit {
  std::int64_t amount = 0;
  ReplyTo<std::int64_t> reply_to;
  // When positive, the handler first marks the entity as held (see the
  // node's --history) and sleeps this long, then persists: a node frozen
  // meanwhile wakes up in the middle of this command, about to append.
  std::int64_t hold_ms = 0;
};
struct Where {  // "<node> <balance>[ settling]"
  ReplyTo<std::string> reply_to;
};
struct StartSettle {
  ReplyTo<std::string> reply_to;
};
struct Finish {};
// Adds `amount` once per `op`: a repeat of an op is answered with the
// balance that op left, and stores nothing. Registered idempotent.
struct Credit {
  std::string op;
  std::int64_t amount = 0;
  ReplyTo<std::int64_t> reply_to;
};
using LedgerCmd = std::variant<Deposit, Where, StartSettle, Finish, Credit>;

struct Deposited {
  std::int64_t amount = 0;
};
struct SettleStarted {};
struct SettleEnded {};
struct Credited {
  std::string op;
  std::int64_t amount = 0;
};
using LedgerEvent = std::variant<Deposited, SettleStarted, SettleEnded, Credited>;

struct LedgerState {
  std::int64_t balance = 0;
  bool settling = false;
  std::map<std::string, std::int64_t> credits;  // op -> the balance it left
};

namespace codec {
inline void str(const std::string& v, ByteWriter& w) { w.str(v); }
inline Result<std::string> str_back(ByteReader& r) {
  std::string v = r.str();
  return r.finish(std::move(v));
}
inline void i64(const std::int64_t& v, ByteWriter& w) { w.i64(v); }
inline Result<std::int64_t> i64_back(ByteReader& r) {
  std::int64_t v = r.i64();
  return r.finish(v);
}
template <class T>
Result<T> empty_back(ByteReader& r) {
  return r.finish(T{});
}
}  // namespace codec

inline EventCodecs<LedgerEvent> ledger_events() {
  EventCodecs<LedgerEvent> c;
  c.add<Deposited>(
      "Deposited", 1, [](const Deposited& e, ByteWriter& w) { w.i64(e.amount); },
      [](std::uint32_t, ByteReader& r) -> Result<Deposited> {
        Deposited e;
        e.amount = r.i64();
        return r.finish(e);
      });
  c.add<SettleStarted>(
      "SettleStarted", 1, [](const SettleStarted&, ByteWriter&) {},
      [](std::uint32_t, ByteReader& r) { return r.finish(SettleStarted{}); });
  c.add<SettleEnded>(
      "SettleEnded", 1, [](const SettleEnded&, ByteWriter&) {},
      [](std::uint32_t, ByteReader& r) { return r.finish(SettleEnded{}); });
  c.add<Credited>(
      "Credited", 1, [](const Credited& e, ByteWriter& w) { w.str(e.op).i64(e.amount); },
      [](std::uint32_t, ByteReader& r) -> Result<Credited> {
        Credited e;
        e.op = r.str();
        e.amount = r.i64();
        return r.finish(std::move(e));
      });
  return c;
}

inline MessageCodecs<LedgerCmd> ledger_commands() {
  MessageCodecs<LedgerCmd> c;
  (void)c.add<Deposit>(
      "ledger.Deposit", [](const Deposit& m, ByteWriter& w) { w.i64(m.amount).i64(m.hold_ms); },
      [](ByteReader& r) -> Result<Deposit> {
        Deposit m;
        m.amount = r.i64();
        m.hold_ms = r.i64();
        return r.finish(std::move(m));
      },
      codec::i64, codec::i64_back);
  (void)c.add<Where>(
      "ledger.Where", [](const Where&, ByteWriter&) {}, codec::empty_back<Where>, codec::str, codec::str_back);
  (void)c.add<StartSettle>(
      "ledger.StartSettle", [](const StartSettle&, ByteWriter&) {}, codec::empty_back<StartSettle>, codec::str,
      codec::str_back);
  (void)c.add<Finish>("ledger.Finish", [](const Finish&, ByteWriter&) {}, codec::empty_back<Finish>);
  (void)c.add<Credit>(
      "ledger.Credit", [](const Credit& m, ByteWriter& w) { w.str(m.op).i64(m.amount); },
      [](ByteReader& r) -> Result<Credit> {
        Credit m;
        m.op = r.str();
        m.amount = r.i64();
        return r.finish(std::move(m));
      },
      codec::i64, codec::i64_back, {.idempotent = true});
  return c;
}

// --- the driver's control requests ---------------------------------------------

struct CtlDeposit {
  std::string entity;
  std::int64_t amount = 0;
  ReplyTo<std::int64_t> reply_to;
  std::int64_t hold_ms = 0;  // Deposit::hold_ms
};
struct CtlWhere {
  std::string entity;
  ReplyTo<std::string> reply_to;
};
struct CtlSettle {
  std::string entity;
  ReplyTo<std::string> reply_to;
};
struct CtlRebalance {  // answers the number of moves
  ReplyTo<std::int64_t> reply_to;
};
struct CtlStats {
  ReplyTo<std::string> reply_to;
};
struct CtlCredit {  // a ledger Credit through the node's region
  std::string entity;
  std::string op;
  std::int64_t amount = 0;
  ReplyTo<std::int64_t> reply_to;
};
using CtlMsg = std::variant<CtlDeposit, CtlWhere, CtlSettle, CtlRebalance, CtlStats, CtlCredit>;

inline MessageCodecs<CtlMsg> ctl_codecs() {
  MessageCodecs<CtlMsg> c;
  (void)c.add<CtlDeposit>(
      "ctl.Deposit", [](const CtlDeposit& m, ByteWriter& w) { w.str(m.entity).i64(m.amount).i64(m.hold_ms); },
      [](ByteReader& r) -> Result<CtlDeposit> {
        CtlDeposit m;
        m.entity = r.str();
        m.amount = r.i64();
        m.hold_ms = r.i64();
        return r.finish(std::move(m));
      },
      codec::i64, codec::i64_back);
  auto entity_only = [](auto tag) {
    using T = decltype(tag);
    return std::make_pair([](const T& m, ByteWriter& w) { w.str(m.entity); },
                          [](ByteReader& r) -> Result<T> {
                            T m;
                            m.entity = r.str();
                            return r.finish(std::move(m));
                          });
  };
  auto [we, wd] = entity_only(CtlWhere{});
  (void)c.add<CtlWhere>("ctl.Where", we, wd, codec::str, codec::str_back);
  auto [se, sd] = entity_only(CtlSettle{});
  (void)c.add<CtlSettle>("ctl.Settle", se, sd, codec::str, codec::str_back);
  (void)c.add<CtlRebalance>(
      "ctl.Rebalance", [](const CtlRebalance&, ByteWriter&) {}, codec::empty_back<CtlRebalance>, codec::i64,
      codec::i64_back);
  (void)c.add<CtlStats>(
      "ctl.Stats", [](const CtlStats&, ByteWriter&) {}, codec::empty_back<CtlStats>, codec::str, codec::str_back);
  (void)c.add<CtlCredit>(
      "ctl.Credit", [](const CtlCredit& m, ByteWriter& w) { w.str(m.entity).str(m.op).i64(m.amount); },
      [](ByteReader& r) -> Result<CtlCredit> {
        CtlCredit m;
        m.entity = r.str();
        m.op = r.str();
        m.amount = r.i64();
        return r.finish(std::move(m));
      },
      codec::i64, codec::i64_back);
  return c;
}

}  // namespace troupe::cluster::proc
