// Trace ids (SPEC X2, X4): W3C traceparent parsing and formatting, and the
// trace carried by messages: a tell, an ask, its reply and the asker's
// continuation all run under the trace of the message that caused them;
// work outside any trace carries none.
// proves: X4

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/core/trace.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ActorRef;
using troupe::ReplyTo;
using troupe::TraceContext;
using troupe::TraceId;
using troupe::TraceScope;

constexpr std::string_view kValid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceparentTest, AValidHeaderIsReadFieldByField) {
  auto c = TraceContext::parse(kValid);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->trace_id.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(c->span_id.hex(), "00f067aa0ba902b7");
  EXPECT_EQ(c->flags, 1);
  EXPECT_EQ(c->traceparent(), kValid);
}

TEST(TraceparentTest, MalformedHeadersAreRefused) {
  const std::string bad[] = {
      "",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",     // short
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",   // version 00 with more after it
      "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",    // separator in the wrong place
      "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // wrong separator
      "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",    // not hex
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // uppercase
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // all-zero trace id
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // all-zero span id
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version ff
      "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version not hex
      "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",   // later version, no '-' after flags
      " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // leading space
  };
  for (const auto& h : bad) EXPECT_FALSE(TraceContext::parse(h)) << "'" << h << "'";
}

TEST(TraceparentTest, ALaterVersionIsReadByItsFirstFourFields) {
  auto c = TraceContext::parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->trace_id.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
}

TEST(TraceparentTest, AMalformedOrMissingHeaderGetsANewTraceNeverAnError) {
  auto kept = TraceContext::from_header(kValid);
  EXPECT_EQ(kept.trace_id.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_NE(kept.span_id.hex(), "00f067aa0ba902b7") << "this hop has a span of its own";
  for (std::string_view h : {std::string_view(), std::string_view("garbage"),
                             std::string_view("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}) {
    auto fresh = TraceContext::from_header(h);
    EXPECT_TRUE(fresh.valid());
    EXPECT_NE(fresh.trace_id.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    EXPECT_EQ(fresh.flags, 1);
    EXPECT_TRUE(TraceContext::parse(fresh.traceparent())) << fresh.traceparent();
  }
  EXPECT_NE(TraceContext::generate().trace_id, TraceContext::generate().trace_id);
}

TEST(TraceparentTest, TraceIdHexRoundTrips) {
  auto id = TraceId::from_hex("0123456789abcdef0123456789abcdef");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->hex(), "0123456789abcdef0123456789abcdef");
  EXPECT_FALSE(TraceId::from_hex("0123456789abcdef0123456789abcde"));
  EXPECT_FALSE(TraceId::from_hex(std::string(32, '0')));
}

TEST(TraceScopeTest, ScopesNestAndRestore) {
  EXPECT_EQ(troupe::current_trace(), nullptr);
  auto a = TraceContext::generate();
  auto b = TraceContext::generate();
  {
    TraceScope sa(a);
    ASSERT_NE(troupe::current_trace(), nullptr);
    EXPECT_EQ(*troupe::current_trace(), a);
    {
      TraceScope sb(b);
      EXPECT_EQ(*troupe::current_trace(), b);
      {
        TraceScope none;
        EXPECT_EQ(troupe::current_trace(), nullptr);
        EXPECT_EQ(troupe::current_trace_id(), "");
      }
      EXPECT_EQ(*troupe::current_trace(), b);
    }
    EXPECT_EQ(troupe::current_trace_id(), a.trace_id.hex());
  }
  EXPECT_EQ(troupe::current_trace(), nullptr);
}

// --- propagation through actors -----------------------------------------------------

// What each step saw as its current trace ("" for none).
struct Seen {
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> steps;
  void note(std::string step) {
    std::lock_guard lk(mu);
    steps.emplace_back(std::move(step), troupe::current_trace_id());
  }
  std::string at(const std::string& step) {
    std::lock_guard lk(mu);
    for (auto& [s, t] : steps)
      if (s == step) return t;
    return "(not reached)";
  }
};

struct Question {
  ReplyTo<int> reply;
};
struct Answerer : troupe::Actor<Question> {
  explicit Answerer(Seen* s) : seen(s) {}
  void receive(Question& q) {
    seen->note("answerer");
    q.reply(42);
  }
  Seen* seen;
};

struct Note {
  std::string step;
};
struct Recorder : troupe::Actor<Note> {
  explicit Recorder(Seen* s) : seen(s) {}
  void receive(Note& n) { seen->note(n.step); }
  Seen* seen;
};

struct Go {
  std::string tag;
};
struct Asker : troupe::Actor<Go> {
  Asker(Seen* s, ActorRef<Question> a, ActorRef<Note> r) : seen(s), answerer(std::move(a)), recorder(std::move(r)) {}
  void receive(Go& g) {
    seen->note("asker " + g.tag);
    recorder.tell(Note{"told by " + g.tag});
    this->template ask<int>(answerer, [](ReplyTo<int> rt) { return Question{std::move(rt)}; }, 10s,
                            [this, tag = g.tag](troupe::Result<int>) {
                              seen->note("continuation " + tag);
                              recorder.tell(Note{"told from the continuation of " + tag});
                            });
  }
  Seen* seen;
  ActorRef<Question> answerer;
  ActorRef<Note> recorder;
};

TEST(TracePropagationTest, TellAskReplyAndContinuationCarryTheTraceOfTheirCause) {
  troupe::ActorSystem system(troupe::SystemConfig{.threads = 2});
  Seen seen;
  auto answerer = system.spawn<Answerer>(&seen);
  auto recorder = system.spawn<Recorder>(&seen);
  auto asker = system.spawn<Asker>(&seen, answerer, recorder);
  auto ctx = TraceContext::generate();
  const std::string id = ctx.trace_id.hex();
  {
    TraceScope scope(ctx);
    asker.tell(Go{"traced"});
  }
  ASSERT_TRUE(system.wait_idle());
  asker.tell(Go{"untraced"});  // outside any trace
  ASSERT_TRUE(system.wait_idle());

  EXPECT_EQ(seen.at("asker traced"), id);
  EXPECT_EQ(seen.at("told by traced"), id);
  EXPECT_EQ(seen.at("answerer"), id) << "the ask's request carries the trace";
  EXPECT_EQ(seen.at("continuation traced"), id) << "the asker's continuation runs under its trace";
  EXPECT_EQ(seen.at("told from the continuation of traced"), id);
  EXPECT_EQ(seen.at("asker untraced"), "") << "a worker does not keep the trace of the message before";
  EXPECT_EQ(seen.at("told by untraced"), "");
  EXPECT_EQ(seen.at("continuation untraced"), "");
  EXPECT_EQ(troupe::current_trace(), nullptr);
}

TEST(TracePropagationTest, AnAskFromOutsideCarriesTheCallersTrace) {
  troupe::ActorSystem system(troupe::SystemConfig{.threads = 1});
  Seen seen;
  auto answerer = system.spawn<Answerer>(&seen);
  auto ctx = TraceContext::generate();
  troupe::Future<int> f = [&] {
    TraceScope scope(ctx);
    return system.ask<int>(answerer, [](ReplyTo<int> rt) { return Question{std::move(rt)}; }, 10s);
  }();
  ASSERT_TRUE(f.get().ok());
  EXPECT_EQ(seen.at("answerer"), ctx.trace_id.hex());
}

}  // namespace
