#pragma once
// A small entity for the node's tests (node_tests, troupectl_tests): a
// tally that can be held in a processing episode, with its event codecs and
// its commands' wire codecs. Header-only, for test binaries.

#include <chrono>
#include <cstdint>
#include <optional>
#include <variant>

#include "troupe/cluster/messages.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"

namespace troupe::node::test {

struct Add {
  std::int64_t n = 0;
  troupe::ReplyTo<std::int64_t> reply_to;
};
struct Hold {
  troupe::ReplyTo<std::int64_t> reply_to;
};
struct Get {
  troupe::ReplyTo<std::int64_t> reply_to;
};
using TallyCommand = std::variant<Add, Hold, Get>;
struct Added {
  std::int64_t n = 0;
};
struct Held {};
struct HoldTimedOut {};
using TallyEvent = std::variant<Added, Held, HoldTimedOut>;
struct TallyState {
  std::int64_t total = 0;
  bool held = false;
};

struct Tally {
  using Command = TallyCommand;
  using Event = TallyEvent;
  using State = TallyState;
  using Effect = troupe::Effect<Event, State>;

  Effect on_command(const State& s, Command& c, troupe::EntityContext<Tally>&) {
    return troupe::match(
        c,
        [&](Add& a) {
          return Effect::persist(Added{a.n}).then_reply(a.reply_to, [](const State& st) { return st.total; });
        },
        [&](Hold& h) {
          return Effect::persist(Held{}).then_reply(h.reply_to, [](const State& st) { return st.total; });
        },
        [&](Get& g) { return Effect::reply(g.reply_to, s.total); });
  }
  void on_event(State& s, const Event& e) const {
    troupe::match(
        e, [&](const Added& a) { s.total += a.n; }, [&](const Held&) { s.held = true; },
        [&](const HoldTimedOut&) { s.held = false; });
  }
  std::optional<troupe::Processing<Event>> processing(const State& s) const {
    if (!s.held) return std::nullopt;
    return troupe::Processing<Event>{std::chrono::hours(1), HoldTimedOut{}};
  }
};

inline troupe::EventCodecs<TallyEvent> tally_codecs() {
  troupe::EventCodecs<TallyEvent> c;
  c.add<Added>(
      "Added", 1, [](const Added& e, troupe::ByteWriter& w) { w.i64(e.n); },
      [](std::uint32_t, troupe::ByteReader& r) -> troupe::Result<Added> {
        Added e;
        e.n = r.i64();
        return r.finish(std::move(e));
      });
  c.add<Held>(
      "Held", 1, [](const Held&, troupe::ByteWriter&) {},
      [](std::uint32_t, troupe::ByteReader& r) -> troupe::Result<Held> { return r.finish(Held{}); });
  c.add<HoldTimedOut>(
      "HoldTimedOut", 1, [](const HoldTimedOut&, troupe::ByteWriter&) {},
      [](std::uint32_t, troupe::ByteReader& r) -> troupe::Result<HoldTimedOut> { return r.finish(HoldTimedOut{}); });
  return c;
}

inline troupe::cluster::MessageCodecs<TallyCommand> tally_commands() {
  using troupe::ByteReader;
  using troupe::ByteWriter;
  auto i64 = [](const std::int64_t& v, ByteWriter& w) { w.i64(v); };
  auto i64_back = [](ByteReader& r) -> troupe::Result<std::int64_t> {
    std::int64_t v = r.i64();
    return r.finish(v);
  };
  troupe::cluster::MessageCodecs<TallyCommand> c;
  (void)c.add<Add>(
      "tally.Add", [](const Add& m, ByteWriter& w) { w.i64(m.n); },
      [](ByteReader& r) -> troupe::Result<Add> {
        Add m;
        m.n = r.i64();
        return r.finish(std::move(m));
      },
      i64, i64_back);
  (void)c.add<Hold>(
      "tally.Hold", [](const Hold&, ByteWriter&) {}, [](ByteReader& r) { return r.finish(Hold{}); }, i64, i64_back);
  (void)c.add<Get>(
      "tally.Get", [](const Get&, ByteWriter&) {}, [](ByteReader& r) { return r.finish(Get{}); }, i64, i64_back);
  return c;
}

}  // namespace troupe::node::test
