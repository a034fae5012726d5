// Remote actors between two Remoting layers in one process over loopback
// TCP: asks answered across the wire, and where the continuation of a
// remote ask runs.
//
// Real sockets and real time: every wait is bounded and generous, and no
// test asserts a speed.

#include "troupe/cluster/remote.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "troupe/cluster/transport.hpp"
#include "troupe/core.hpp"
#include "troupe/core/trace.hpp"

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;

struct Echo {
  std::uint64_t value = 0;
  ReplyTo<std::uint64_t> reply_to;
};
struct Open {};  // local only: answer what was held, and answer at once from now on
using EchoMsg = std::variant<Echo, Open>;

// Answers each Echo with its value; one spawned `holding` keeps requests
// until it gets Open.
struct Echoer : Actor<EchoMsg> {
  explicit Echoer(bool holding = false, std::atomic<std::size_t>* held = nullptr) : hold(holding), count(held) {}
  bool hold;
  std::atomic<std::size_t>* count;
  std::vector<Echo> waiting;
  void receive(EchoMsg& m) {
    if (std::holds_alternative<Open>(m)) {
      hold = false;
      for (auto& e : waiting) e.reply_to.reply(e.value);
      waiting.clear();
      return;
    }
    auto& e = std::get<Echo>(m);
    if (!hold) return e.reply_to.reply(e.value);
    waiting.push_back(std::move(e));
    count->fetch_add(1);
  }
};

// Polls `done` every 2 ms until it holds or 30 s pass.
template <class Pred>
bool eventually(Pred&& done) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

std::shared_ptr<const MessageCodecs<EchoMsg>> echo_codecs() {
  auto c = std::make_shared<MessageCodecs<EchoMsg>>();
  auto added = c->add<Echo>(
      "test.Echo", [](const Echo& e, ByteWriter& w) { w.u64(e.value); },
      [](ByteReader& r) -> Result<Echo> {
        Echo e;
        e.value = r.u64();
        return r.finish(std::move(e));
      },
      [](const std::uint64_t& v, ByteWriter& w) { w.u64(v); },
      [](ByteReader& r) -> Result<std::uint64_t> {
        std::uint64_t v = r.u64();
        return r.finish(v);
      });
  EXPECT_TRUE(added.ok());
  EXPECT_TRUE(c->add<Open>(
                    "test.Open", [](const Open&, ByteWriter&) {},
                    [](ByteReader& r) -> Result<Open> { return r.finish(Open{}); })
                  .ok());
  return c;
}

// Two nodes, "a" asking and "b" serving an Echoer published as "echo".
class Remote : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto* n : {&a_, &b_}) {
      SystemConfig cfg;
      cfg.threads = 2;
      cfg.log_dead_letters = false;
      n->system = std::make_unique<ActorSystem>(std::move(cfg));
      Remoting::Settings rs;
      rs.security.insecure = true;
      rs.node_id = n == &a_ ? "a" : "b";
      auto r = Remoting::start(*n->system, rs);
      ASSERT_TRUE(r.ok()) << r.error().to_string();
      n->remoting = std::move(r.value());
    }
    a_.remoting->set_peer("b", "127.0.0.1", b_.remoting->port());
    b_.remoting->set_peer("a", "127.0.0.1", a_.remoting->port());
    auto codecs = echo_codecs();
    ASSERT_TRUE(b_.remoting->publish<EchoMsg>("echo", b_.system->spawn<Echoer>(), *codecs).ok());
    gate_ = b_.system->spawn<Echoer>(true, &held_);
    ASSERT_TRUE(b_.remoting->publish<EchoMsg>("gated", gate_, *codecs).ok());
    echo_ = a_.remoting->remote<EchoMsg>("b", "echo", codecs);
    gated_ = a_.remoting->remote<EchoMsg>("b", "gated", codecs);
  }
  void TearDown() override {
    for (auto* n : {&a_, &b_}) {
      if (n->remoting) n->remoting->stop();
      if (n->system) n->system->shutdown();
    }
  }

  static Future<std::uint64_t> ask(const RemoteRef<EchoMsg>& to, std::uint64_t v) {
    return to.ask<std::uint64_t>([v](ReplyTo<std::uint64_t> rt) { return Echo{v, std::move(rt)}; }, 30s);
  }
  Future<std::uint64_t> ask(std::uint64_t v) { return ask(echo_, v); }

  struct N {
    std::unique_ptr<ActorSystem> system;
    std::unique_ptr<Remoting> remoting;
  };
  N a_, b_;
  std::atomic<std::size_t> held_{0};
  ActorRef<EchoMsg> gate_;
  RemoteRef<EchoMsg> echo_, gated_;
};

// Records the trace each message arrives under ("" for none), and answers Echo.
struct TraceSeen {
  std::mutex mu;
  std::vector<std::string> traces;
  std::size_t size() {
    std::lock_guard lk(mu);
    return traces.size();
  }
};
struct TraceRecorder : Actor<EchoMsg> {
  explicit TraceRecorder(std::shared_ptr<TraceSeen> s) : seen(std::move(s)) {}
  std::shared_ptr<TraceSeen> seen;
  void receive(EchoMsg& m) {
    {
      std::lock_guard lk(seen->mu);
      seen->traces.push_back(current_trace_id());
    }
    if (auto* e = std::get_if<Echo>(&m)) e->reply_to.reply(e->value);
  }
};

// proves: X4
TEST_F(Remote, ATellAndAnAskSentUnderATraceAreHandledUnderItOnTheOtherNode) {
  auto seen = std::make_shared<TraceSeen>();
  auto codecs = echo_codecs();
  ASSERT_TRUE(b_.remoting->publish<EchoMsg>("traced", b_.system->spawn<TraceRecorder>(seen), *codecs).ok());
  auto to = a_.remoting->remote<EchoMsg>("b", "traced", codecs);
  auto ctx = TraceContext::generate();
  {
    TraceScope scope(ctx);
    ASSERT_TRUE(to.tell(Open{}).ok());
    ASSERT_TRUE(ask(to, 7).get().ok());
  }
  ASSERT_TRUE(ask(to, 8).get().ok());  // outside any trace
  ASSERT_TRUE(eventually([&] { return seen->size() == 3; }));
  std::lock_guard lk(seen->mu);
  EXPECT_EQ(seen->traces, (std::vector<std::string>{ctx.trace_id.hex(), ctx.trace_id.hex(), ""}));
}

TEST_F(Remote, AnAskIsAnsweredWithTheRemoteActorsReply) {
  for (std::uint64_t i = 1; i <= 100; ++i) {
    auto r = ask(i).get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r.value(), i);
  }
  // The answers came back on a quiet connection: at least some of them, and
  // the requests after them, were written by their senders' own threads.
  EXPECT_GT(a_.remoting->transport().stats().direct_writes, 0u);
  EXPECT_GT(b_.remoting->transport().stats().direct_writes, 0u);
}

// The answer arrives on the transport's io thread, which serves every
// connection of the node: a continuation that blocks must not hold it.
TEST_F(Remote, AContinuationOnARemoteAskRunsOffTheIoThreadSoBlockingItStallsNoOtherAnswer) {
  // Shared with the continuation, which outlives this scope if a check fails.
  struct Latch {
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false;
    bool release = false;
    bool left = false;
    std::uint64_t seen = 0;
  };
  auto l = std::make_shared<Latch>();
  ask(7).then([l](Result<std::uint64_t> r) {
    std::unique_lock lk(l->mu);
    l->seen = r.ok() ? r.value() : 0;
    l->entered = true;
    l->cv.notify_all();
    l->cv.wait(lk, [&] { return l->release; });
    l->left = true;
    l->cv.notify_all();
  });
  {
    std::unique_lock lk(l->mu);
    ASSERT_TRUE(l->cv.wait_for(lk, 30s, [&] { return l->entered; }));
    EXPECT_EQ(l->seen, 7u);
  }
  // The continuation above is still blocked; later answers still come in.
  for (std::uint64_t i = 0; i < 10; ++i) {
    auto r = ask(100 + i).get();
    EXPECT_TRUE(r.ok()) << r.error().to_string();
  }
  std::unique_lock lk(l->mu);
  l->release = true;
  l->cv.notify_all();
  EXPECT_TRUE(l->cv.wait_for(lk, 30s, [&] { return l->left; }));
}

// Continuations of answers from one node run one after another, in the
// order the answers arrived.
TEST_F(Remote, ContinuationsOfAnswersRunInTheOrderTheAnswersArrived) {
  constexpr std::uint64_t kAsks = 500;
  struct Seen {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::uint64_t> order;
  };
  auto seen = std::make_shared<Seen>();
  // Held on b until every continuation is attached, then answered in order
  // by one actor over the one connection.
  for (std::uint64_t i = 0; i < kAsks; ++i) {
    ask(gated_, i).then([seen](Result<std::uint64_t> r) {
      std::lock_guard lk(seen->mu);
      seen->order.push_back(r.ok() ? r.value() : ~std::uint64_t{0});
      seen->cv.notify_all();
    });
  }
  ASSERT_TRUE(eventually([&] { return held_.load() == kAsks; }));
  (void)gate_.tell(Open{});
  std::unique_lock lk(seen->mu);
  ASSERT_TRUE(seen->cv.wait_for(lk, 30s, [&] { return seen->order.size() == kAsks; }));
  for (std::uint64_t i = 0; i < kAsks; ++i) EXPECT_EQ(seen->order[i], i);
}

// What a node answers a peer whose asks are malformed, seen from a bare
// transport "c" that writes the frames itself: each ask is answered with
// the error at the request id it carries, a name nothing is published under
// before a missing message id, and the node goes on serving.
// proves: X1
TEST_F(Remote, MalformedAsksAreAnsweredWithTheReasonAndTheNodeGoesOnServing) {
  std::mutex mu;
  std::vector<std::string> replies;
  TransportSettings ts;
  ts.node_id = "c";
  ts.insecure = true;
  auto c = Transport::start(std::move(ts), [&](std::string_view, std::uint32_t type, std::string_view payload) {
    if (type != static_cast<std::uint32_t>(detail::RemoteKind::reply)) return;
    std::lock_guard lk(mu);
    replies.emplace_back(payload);
  });
  ASSERT_TRUE(c.ok()) << c.error().message();
  (*c)->set_peer("b", "127.0.0.1", b_.remoting->port());
  b_.remoting->set_peer("c", "127.0.0.1", (*c)->port());
  auto ask = [&](ByteWriter w) {
    ASSERT_TRUE((*c)->send("b", static_cast<std::uint32_t>(detail::RemoteKind::actor_ask), w.bytes()).ok());
  };
  ByteWriter name_cut;
  name_cut.u64(77).u32(40).bytes().append("ech");
  ask(std::move(name_cut));
  ByteWriter unpublished;
  unpublished.u64(78).str("nobody").u8(1);
  ask(std::move(unpublished));
  ByteWriter id_cut;
  id_cut.u64(79).str("echo").u8(1).u8(2);
  ask(std::move(id_cut));
  ByteWriter good;
  good.u64(80).str("echo").u32(message_id("test.Echo")).u64(5);
  ask(std::move(good));
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(mu);
    return replies.size() == 4;
  }));
  std::lock_guard lk(mu);
  auto error_reply = [&](const std::string& bytes, std::uint64_t req, ErrorCode code, std::string_view message) {
    ByteReader r(bytes);
    EXPECT_EQ(r.u64(), req);
    EXPECT_EQ(r.u8(), 1);
    EXPECT_EQ(static_cast<ErrorCode>(r.u32()), code);
    EXPECT_NE(r.str().find(message), std::string::npos);
    EXPECT_FALSE(r.failed());
  };
  error_reply(replies[0], 77, ErrorCode::protocol_error, "frame ends inside its header");
  error_reply(replies[1], 78, ErrorCode::dead_letter, "nothing is published as 'nobody'");
  error_reply(replies[2], 79, ErrorCode::protocol_error, "frame ends inside its header");
  ByteReader answer(replies[3]);
  EXPECT_EQ(answer.u64(), 80u);
  EXPECT_EQ(answer.u8(), 0);
  EXPECT_EQ(answer.u64(), 5u);
  EXPECT_TRUE(answer.finish(0).ok());
}

}  // namespace
}  // namespace troupe::cluster
