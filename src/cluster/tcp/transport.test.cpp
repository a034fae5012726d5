// Transports in one process talking over loopback TCP: delivery both ways
// and in order, the connection rule, large frames, the frame and outbound
// bounds, queued frames across a peer's restart, removal, keepalive, stop
// under load and concurrent senders.
//
// Real sockets and real time: every wait is bounded and generous, and no
// test asserts a speed. (The transport's timeouts are socket timers on its
// io thread, so they are exercised here with short settings rather than a
// manual clock.)

#include "troupe/cluster/transport.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "transport_test_support.hpp"
#include "troupe/core/log.hpp"

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;
using testing::both_connected;
using testing::eventually;
using testing::free_port;
using testing::introduce;
using testing::Node;
using testing::RawServer;
using testing::test_settings;
using tcp::FrameKind;

using testing::u64_bytes;
using testing::u64_of;

TEST(Transport, TwoTransportsExchangeFramesBothWays) {
  Node a = Node::start("a");
  Node b = Node::start("b");
  introduce(a, b);
  ASSERT_TRUE(a->send("b", 1, "one").ok());
  ASSERT_TRUE(a->send("b", 2, "two").ok());
  ASSERT_TRUE(b->send("a", 3, "three").ok());
  ASSERT_TRUE(b.inbox->wait_count(2));
  ASSERT_TRUE(a.inbox->wait_count(1));
  auto at_b = b.inbox->frames();
  EXPECT_EQ(at_b[0].from, "a");
  EXPECT_EQ(at_b[0].type, 1u);
  EXPECT_EQ(at_b[0].payload, "one");
  EXPECT_EQ(at_b[1].payload, "two");
  auto at_a = a.inbox->frames();
  EXPECT_EQ(at_a[0].from, "b");
  EXPECT_EQ(at_a[0].type, 3u);
  EXPECT_EQ(at_a[0].payload, "three");
  EXPECT_TRUE(eventually([&] { return a->stats().frames_sent == 2 && b->stats().frames_received == 2; }));
  EXPECT_TRUE(a->connected("b"));
  EXPECT_TRUE(b->connected("a"));
}

TEST(Transport, TheNodeWithTheSmallerIdDialsAndEachPairSharesOneConnection) {
  Node a = Node::start("a");
  Node b = Node::start("b");
  introduce(a, b);
  ASSERT_TRUE(both_connected(a, b));
  ASSERT_TRUE(a->send("b", 1, "x").ok());
  ASSERT_TRUE(b->send("a", 1, "y").ok());
  ASSERT_TRUE(a.inbox->wait_count(1) && b.inbox->wait_count(1));
  const TransportStats sa = a->stats();
  const TransportStats sb = b->stats();
  EXPECT_EQ(sa.connections_opened, 1u);
  EXPECT_EQ(sa.connections_accepted, 0u);
  EXPECT_EQ(sb.connections_opened, 0u);
  EXPECT_EQ(sb.connections_accepted, 1u);
  EXPECT_EQ(sa.handshakes, 1u);
  EXPECT_EQ(sb.handshakes, 1u);
  auto peers = a->peers();
  ASSERT_EQ(peers.size(), 1u);
  EXPECT_TRUE(peers[0].dials);
  EXPECT_EQ(peers[0].incarnation, b->incarnation());
  EXPECT_FALSE(b->peers()[0].dials);
  EXPECT_NE(a->incarnation(), b->incarnation());
}

TEST(Transport, ThreeTransportsEachReachTheOtherTwo) {
  Node a = Node::start("a");
  Node b = Node::start("b");
  Node c = Node::start("c");
  introduce(a, b);
  introduce(a, c);
  introduce(b, c);
  for (Node* from : {&a, &b, &c}) {
    for (Node* to : {&a, &b, &c}) {
      if (from == to) continue;
      ASSERT_TRUE((*from)->send((*to)->node_id(), 9, (*from)->node_id() + ">" + (*to)->node_id()).ok());
    }
  }
  for (Node* n : {&a, &b, &c}) {
    ASSERT_TRUE(n->inbox->wait_count(2)) << (*n)->node_id();
    for (const auto& f : n->inbox->frames()) EXPECT_EQ(f.payload, f.from + ">" + (*n)->node_id());
  }
  EXPECT_EQ(a->stats().connections_opened, 2u);
  EXPECT_EQ(b->stats().connections_opened, 1u);
  EXPECT_EQ(b->stats().connections_accepted, 1u);
  EXPECT_EQ(c->stats().connections_accepted, 2u);
}

TEST(Transport, AHundredThousandFramesArriveInTheOrderTheyWereSent) {
  constexpr std::uint64_t kFrames = 100'000;
  std::atomic<std::uint64_t> next{0};
  std::atomic<std::uint64_t> out_of_order{0};
  Node b;
  b.t = Transport::start(test_settings("b"), [&](std::string_view, std::uint32_t, std::string_view payload) {
          if (u64_of(payload) != next.load(std::memory_order_relaxed)) out_of_order.fetch_add(1);
          next.fetch_add(1);
        }).value();
  Node a = Node::start("a");
  introduce(a, b);
  const std::string pad(24, 'p');
  for (std::uint64_t i = 0; i < kFrames; ++i) {
    Result<void> r = a->send("b", 5, u64_bytes(i) + pad);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  ASSERT_TRUE(eventually([&] { return next.load() == kFrames; }));
  EXPECT_EQ(out_of_order.load(), 0u);
  EXPECT_TRUE(eventually([&] { return a->stats().frames_sent == kFrames; }));
}

TEST(Transport, AOneMebibytePayloadArrivesWholeAndInOrderWithSmallOnes) {
  Node a = Node::start("a");
  Node b = Node::start("b");
  introduce(a, b);
  std::string big(1u << 20, '\0');
  std::mt19937 rng(7);
  for (auto& ch : big) ch = static_cast<char>(rng());
  ASSERT_TRUE(a->send("b", 1, "before").ok());
  ASSERT_TRUE(a->send("b", 2, big).ok());
  ASSERT_TRUE(a->send("b", 3, "after").ok());
  ASSERT_TRUE(b.inbox->wait_count(3));
  auto got = b.inbox->frames();
  EXPECT_EQ(got[0].payload, "before");
  EXPECT_EQ(got[1].type, 2u);
  EXPECT_TRUE(got[1].payload == big) << "payload of " << got[1].payload.size() << " bytes differs";
  EXPECT_EQ(got[2].payload, "after");
}

// proves: X1
TEST(Transport, AFrameOverMaxFrameBytesIsRefusedAtSendWithInvalidArgument) {
  TransportSettings s = test_settings("a");
  s.max_frame_bytes = 4096;
  Node a = Node::start(s);
  Node b = Node::start("b");
  introduce(a, b);
  // The length field counts version, kind and type: 4096 - 6 payload bytes fit.
  ASSERT_TRUE(a->send("b", 1, std::string(4090, 'x')).ok());
  Result<void> r = a->send("b", 1, std::string(4091, 'x'));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(a->stats().refused_too_large, 1u);
  ASSERT_TRUE(a->send("b", 2, "last").ok());
  ASSERT_TRUE(b.inbox->wait_count(2));
  auto got = b.inbox->frames();
  EXPECT_EQ(got[0].payload.size(), 4090u);
  EXPECT_EQ(got[1].payload, "last");
}

// proves: X1
TEST(Transport, AReceiverClosesAConnectionCarryingAFrameOverItsLimitAndTheDialerComesBack) {
  TransportSettings sb = test_settings("b");
  sb.max_frame_bytes = 4096;
  Node a = Node::start("a");
  Node b = Node::start(sb);
  introduce(a, b);
  ASSERT_TRUE(both_connected(a, b));
  ASSERT_TRUE(a->send("b", 1, std::string(10000, 'x')).ok());
  ASSERT_TRUE(eventually([&] { return b->stats().closed_for_bad_input.oversized == 1; }));
  EXPECT_TRUE(b.log->wait_for("[oversized]")) << b.log->all();
  // The dialer redials; small frames get through on the new connection.
  ASSERT_TRUE(eventually([&] {
    (void)a->send("b", 2, "small");
    return b.inbox->count() > 0;
  }));
  EXPECT_EQ(b.inbox->frames()[0].payload, "small");
}

TEST(Transport, SendToANodeNeverGivenBySetPeerIsUnreachable) {
  Node a = Node::start("a");
  Result<void> r = a->send("nobody", 1, "x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::unreachable);
  EXPECT_EQ(a->stats().refused_unknown, 1u);
  EXPECT_FALSE(a->connected("nobody"));
}

TEST(Transport, FramesSentBeforeThePeerIsUpWaitAndGoOutTogether) {
  const std::uint16_t port = free_port();
  Node a = Node::start("a");
  a->set_peer("b", "127.0.0.1", port);
  constexpr int kFrames = 1000;
  for (int i = 0; i < kFrames; ++i) ASSERT_TRUE(a->send("b", 1, u64_bytes(static_cast<std::uint64_t>(i))).ok());
  EXPECT_FALSE(a->connected("b"));
  TransportSettings sb = test_settings("b");
  sb.listen_port = port;
  Node b = Node::start(sb);
  b->set_peer("a", "127.0.0.1", a.port());
  ASSERT_TRUE(b.inbox->wait_count(kFrames));
  auto got = b.inbox->frames();
  for (int i = 0; i < kFrames; ++i) ASSERT_EQ(u64_of(got[static_cast<std::size_t>(i)].payload), static_cast<std::uint64_t>(i));
  // Everything queued was there when the handshake finished: one write
  // carried it (a few more are the HELLO and keepalive traffic).
  EXPECT_TRUE(eventually([&] { return a->stats().frames_sent == kFrames; }));
  EXPECT_LT(a->stats().write_batches, 10u);
}

TEST(Transport, TheOutboundBoundRefusesWithBufferOverflowWhileThePeerIsDownAndLosesNothingElse) {
  const std::uint16_t port = free_port();
  TransportSettings sa = test_settings("a");
  constexpr std::size_t kPayload = 100;
  sa.max_outbound_bytes = 10 * data_frame_size(kPayload);
  Node a = Node::start(sa);
  a->set_peer("b", "127.0.0.1", port);
  auto payload = [&](std::uint64_t i) { return u64_bytes(i) + std::string(kPayload - 8, '.'); };
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(a->send("b", 1, payload(i)).ok()) << i;
  for (int i = 0; i < 5; ++i) {
    Result<void> r = a->send("b", 1, payload(1000));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::buffer_overflow);
  }
  EXPECT_EQ(a->stats().refused_full, 5u);
  ASSERT_EQ(a->peers().size(), 1u);
  EXPECT_EQ(a->peers()[0].outbound_bytes, sa.max_outbound_bytes);
  // A smaller frame that would still pass the bound is refused too.
  EXPECT_EQ(a->send("b", 1, "").error().code(), ErrorCode::buffer_overflow);

  TransportSettings sb = test_settings("b");
  sb.listen_port = port;
  Node b = Node::start(sb);
  b->set_peer("a", "127.0.0.1", a.port());
  ASSERT_TRUE(b.inbox->wait_count(10));
  // Once written, the room is back.
  ASSERT_TRUE(eventually([&] { return a->peers()[0].outbound_bytes == 0; }));
  ASSERT_TRUE(a->send("b", 1, payload(10)).ok());
  ASSERT_TRUE(b.inbox->wait_count(11));
  auto got = b.inbox->frames();
  ASSERT_EQ(got.size(), 11u);
  for (std::uint64_t i = 0; i < 11; ++i) EXPECT_EQ(u64_of(got[i].payload), i);
}

TEST(Transport, ARestartedPeerIsRecognisedAndGetsTheFramesQueuedForIt) {
  Node a = Node::start("a");
  Node b = Node::start("b");
  introduce(a, b);
  ASSERT_TRUE(both_connected(a, b));
  const std::uint16_t port = b.port();
  const std::uint64_t first = b->incarnation();
  ASSERT_EQ(a->peers()[0].incarnation, first);
  b.t.reset();  // the process "dies"
  ASSERT_TRUE(eventually([&] { return !a->connected("b"); }));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(a->send("b", 1, "queued " + std::to_string(i)).ok());

  TransportSettings sb = test_settings("b");
  sb.listen_port = port;
  Node b2 = Node::start(sb);
  b2->set_peer("a", "127.0.0.1", a.port());
  ASSERT_TRUE(b2.inbox->wait_count(5));
  auto got = b2.inbox->frames();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)].payload, "queued " + std::to_string(i));
  EXPECT_NE(b2->incarnation(), first);
  EXPECT_EQ(a->peers()[0].incarnation, b2->incarnation());
  EXPECT_EQ(a->stats().peer_restarts, 1u);
  EXPECT_TRUE(a.log->contains("node b restarted")) << a.log->all();
  EXPECT_GE(a->stats().reconnects, 1u);
}

TEST(Transport, ThePeerHandlerReportsEachConnectionUpOnceAndDownOnce) {
  Node a = Node::start("a");
  Node b = Node::start("b");
  introduce(a, b);
  ASSERT_TRUE(both_connected(a, b));
  ASSERT_TRUE(eventually([&] { return b.inbox->events().size() == 1; }));
  b.t.reset();
  ASSERT_TRUE(eventually([&] { return a.inbox->events().size() == 2; }));
  EXPECT_EQ(a.inbox->events(), (std::vector<std::string>{"b up", "b down"}));
  EXPECT_EQ(b.inbox->events(), (std::vector<std::string>{"a up"}));
}

TEST(Transport, RemovePeerClosesItsConnectionAndDropsWhatWasQueuedForIt) {
  Node a = Node::start("a");
  Node b = Node::start("b");
  introduce(a, b);
  ASSERT_TRUE(both_connected(a, b));
  a->remove_peer("b");
  EXPECT_EQ(a->send("b", 1, "x").error().code(), ErrorCode::unreachable);
  ASSERT_TRUE(eventually([&] { return !b->connected("a"); }));
  EXPECT_TRUE(a->peers().empty());

  // Frames queued for a peer that is down are dropped by its removal.
  const std::uint16_t port = free_port();
  a->set_peer("c", "127.0.0.1", port);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(a->send("c", 1, "stale").ok());
  a->remove_peer("c");
  EXPECT_EQ(a->stats().frames_dropped, 5u);
  TransportSettings sc = test_settings("c");
  sc.listen_port = port;
  Node c = Node::start(sc);
  c->set_peer("a", "127.0.0.1", a.port());
  a->set_peer("c", "127.0.0.1", port);
  ASSERT_TRUE(both_connected(a, c));
  ASSERT_TRUE(a->send("c", 1, "fresh").ok());
  ASSERT_TRUE(c.inbox->wait_payload("fresh"));
  for (const auto& f : c.inbox->frames()) EXPECT_NE(f.payload, "stale");

  // A removed peer given again connects again.
  a->set_peer("b", "127.0.0.1", b.port());
  ASSERT_TRUE(both_connected(a, b));
  ASSERT_TRUE(a->send("b", 1, "again").ok());
  ASSERT_TRUE(b.inbox->wait_payload("again"));
}

// proves: X1
TEST(Transport, SendEncodedQueuesFramesBuiltWithAppendDataFrameAsOneUnit) {
  Node a = Node::start("a");
  Node b = Node::start("b");
  introduce(a, b);
  std::string batch;
  append_data_frame(batch, 1, "x");
  append_data_frame(batch, 2, "y");
  append_data_frame(batch, 3, "z");
  ASSERT_TRUE(a->send_encoded("b", batch).ok());
  ASSERT_TRUE(b.inbox->wait_count(3));
  auto got = b.inbox->frames();
  EXPECT_EQ(got[0].payload + got[1].payload + got[2].payload, "xyz");
  EXPECT_EQ(got[2].type, 3u);
  // Bytes that are not whole DATA frames are refused, all of them.
  EXPECT_EQ(a->send_encoded("b", batch.substr(0, batch.size() - 1)).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(a->send_encoded("nobody", batch).error().code(), ErrorCode::unreachable);
}

TEST(Transport, AnIdleConnectionStaysUpOnPings) {
  TransportSettings sa = test_settings("a");
  TransportSettings sb = test_settings("b");
  for (auto* s : {&sa, &sb}) {
    s->keepalive_interval = 100ms;
    s->keepalive_timeout = 2s;
  }
  Node a = Node::start(sa);
  Node b = Node::start(sb);
  introduce(a, b);
  ASSERT_TRUE(both_connected(a, b));
  std::this_thread::sleep_for(1s);
  EXPECT_GT(a->stats().pings_sent, 0u);
  EXPECT_EQ(a->stats().connections_closed, 0u);
  EXPECT_EQ(b->stats().connections_closed, 0u);
  ASSERT_TRUE(a->send("b", 1, "still here").ok());
  ASSERT_TRUE(b.inbox->wait_payload("still here"));
}

TEST(Transport, ASilentPeerIsClosedAfterTheKeepaliveTimeoutAndRedialled) {
  RawServer server;
  TransportSettings sa = test_settings("a");
  sa.keepalive_interval = 50ms;
  sa.keepalive_timeout = 300ms;
  Node a = Node::start(sa);
  a->set_peer("b", "127.0.0.1", server.port());
  auto first = server.accept();
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->wait_frames(1));
  EXPECT_EQ(first->frames()[0].node_id, "a");
  first->write(testing::hello("b"));
  // Nothing more from "b": a pings, then gives up on the connection.
  ASSERT_TRUE(first->wait_closed());
  EXPECT_GE(first->count(FrameKind::ping), 1u);
  EXPECT_EQ(a->stats().keepalive_timeouts, 1u);
  EXPECT_TRUE(a.log->wait_for("nothing received for")) << a.log->all();
  auto second = server.accept();
  ASSERT_TRUE(second) << "a did not redial";
  ASSERT_TRUE(second->wait_frames(1));
  EXPECT_EQ(second->frames()[0].kind, FrameKind::hello);
}

TEST(Transport, StopWithTrafficInFlightRunsNoHandlerAfterItReturns) {
  std::atomic<bool> b_stopped{false};
  std::atomic<std::uint64_t> late_calls{0};
  std::atomic<std::uint64_t> b_received{0};
  Node a = Node::start("a");
  Node b;
  b.t = Transport::start(
            test_settings("b"),
            [&](std::string_view, std::uint32_t, std::string_view) {
              if (b_stopped.load()) late_calls.fetch_add(1);
              b_received.fetch_add(1);
            },
            [&](std::string_view, bool) {
              if (b_stopped.load()) late_calls.fetch_add(1);
            })
            .value();
  introduce(a, b);
  ASSERT_TRUE(both_connected(a, b));
  std::atomic<bool> go{true};
  std::thread a_sender([&] {
    while (go.load()) (void)a->send("b", 1, std::string(64, 'a'));
  });
  std::thread b_sender([&] {
    while (go.load()) (void)b->send("a", 1, std::string(64, 'b'));
  });
  ASSERT_TRUE(eventually([&] { return b_received.load() > 1000; }));
  b->stop();
  b_stopped.store(true);
  std::this_thread::sleep_for(100ms);
  go.store(false);
  a_sender.join();
  b_sender.join();
  EXPECT_EQ(late_calls.load(), 0u);
  EXPECT_EQ(b->send("a", 1, "x").error().code(), ErrorCode::shutting_down);
  b->stop();  // idempotent
  b.t.reset();
  a.t.reset();
}

TEST(Transport, StopCalledFromAFrameHandlerDeliversNothingMore) {
  std::atomic<int> calls{0};
  std::atomic<int> after_stop{0};
  std::atomic<bool> stopped{false};
  std::atomic<Transport*> self{nullptr};
  Node b;
  b.t = Transport::start(test_settings("b"), [&](std::string_view, std::uint32_t, std::string_view) {
          if (stopped.load()) after_stop.fetch_add(1);
          if (++calls == 10) {
            self.load()->stop();
            stopped.store(true);
          }
        }).value();
  self.store(b.t.get());
  Node a = Node::start("a");
  introduce(a, b);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(a->send("b", 1, "x").ok());
  ASSERT_TRUE(eventually([&] { return stopped.load(); }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(calls.load(), 10);
  EXPECT_EQ(after_stop.load(), 0);
  b.t.reset();  // joins the io thread from here
}

TEST(Transport, ManyThreadsSendingAtOnceKeepEachThreadsOrder) {
  constexpr int kThreads = 4;
  constexpr std::uint64_t kPerThread = 25'000;
  struct Tally {
    std::uint64_t next[kThreads] = {};
    std::uint64_t disorder = 0;
    std::uint64_t total = 0;
  };
  auto tally = std::make_shared<Tally>();
  std::atomic<std::uint64_t> total{0};
  std::atomic<std::uint64_t> disorder{0};
  Node b;
  b.t = Transport::start(test_settings("b"), [&, tally](std::string_view, std::uint32_t type, std::string_view p) {
          // Runs on b's io thread only: the tally needs no lock.
          const std::uint64_t seq = u64_of(p);
          if (type >= kThreads || seq != tally->next[type]) disorder.fetch_add(1);
          if (type < kThreads) tally->next[type] = seq + 1;
          total.fetch_add(1);
        }).value();
  Node a = Node::start("a");
  introduce(a, b);
  std::vector<std::thread> senders;
  std::atomic<std::uint64_t> refused{0};
  for (int t = 0; t < kThreads; ++t) {
    senders.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < kPerThread; ++i) {
        if (!a->send("b", static_cast<std::uint32_t>(t), u64_bytes(i)).ok()) refused.fetch_add(1);
      }
    });
  }
  // Traffic the other way at the same time.
  std::thread back([&] {
    for (int i = 0; i < 10'000; ++i) (void)b->send("a", 1, "back");
  });
  for (auto& s : senders) s.join();
  back.join();
  EXPECT_EQ(refused.load(), 0u);
  ASSERT_TRUE(eventually([&] { return total.load() == kThreads * kPerThread; }));
  EXPECT_EQ(disorder.load(), 0u);
  ASSERT_TRUE(a.inbox->wait_count(10'000));
}

// Request and answer, one at a time: each side has just received something
// when it sends, so each frame is written by its sender's own thread.
TEST(Transport, AnAnswerToAFrameThatJustArrivedIsWrittenByTheSendingThreadItself) {
  constexpr std::uint64_t kRounds = 200;
  const testing::EchoedRounds run = testing::echo_rounds(test_settings("a"), test_settings("b"), kRounds);
  EXPECT_TRUE(run.in_order);
  // Every answer and every request after the first could go directly; a
  // keepalive PING or PONG in flight makes one wait for the io thread.
  EXPECT_GE(run.b.direct_writes, kRounds / 2);
  EXPECT_GE(run.a.direct_writes, kRounds / 2);
}

// One direct write per arrival: a thread streaming frames writes at most the
// first itself and leaves the rest to the io thread's batches.
TEST(Transport, AStreamOfFramesFromOneThreadIsLeftToTheIoThreadsBatches) {
  constexpr std::uint64_t kFrames = 50'000;
  Node a = Node::start("a");
  Node b = Node::start("b");
  introduce(a, b);
  ASSERT_TRUE(b->send("a", 1, "input for a").ok());
  ASSERT_TRUE(a.inbox->wait_count(1));
  const TransportStats before = a->stats();
  for (std::uint64_t i = 0; i < kFrames; ++i) ASSERT_TRUE(a->send("b", 2, u64_bytes(i)).ok());
  ASSERT_TRUE(b.inbox->wait_count(kFrames));
  auto got = b.inbox->frames();
  for (std::uint64_t i = 0; i < kFrames; ++i) ASSERT_EQ(u64_of(got[i].payload), i);
  const TransportStats after = a->stats();
  // What arrived at a meanwhile (keepalive) may each allow one more.
  EXPECT_LE(after.direct_writes - before.direct_writes, 1 + (after.reads - before.reads));
}

// Frames a sender wrote itself, frames the io thread batched, and the rest
// of a frame the socket took only in part all keep each thread's order.
TEST(Transport, FramesWrittenDirectlyAndInBatchesKeepEachThreadsOrder) {
  const testing::StreamsWithAnswers run =
      testing::stream_with_answers(test_settings("a"), test_settings("b"), 20'000, 2'000);
  EXPECT_TRUE(run.all_arrived);
  EXPECT_EQ(run.disorder, 0u);
  EXPECT_EQ(run.a.frames_dropped, 0u);
  EXPECT_GT(run.a.direct_writes, 0u);
}

TEST(Transport, AFrameHandlerThatThrowsIsLoggedAndLaterFramesStillArrive) {
  std::atomic<int> seen{0};
  auto log = std::make_shared<testing::LogCapture>();
  TransportSettings sb = test_settings("b");
  sb.log = log->sink();
  Node b;
  b.t = Transport::start(sb, [&](std::string_view, std::uint32_t type, std::string_view) {
          ++seen;
          if (type == 1) throw std::runtime_error("handler bug");
        }).value();
  Node a = Node::start("a");
  introduce(a, b);
  ASSERT_TRUE(a->send("b", 1, "throws").ok());
  ASSERT_TRUE(a->send("b", 2, "fine").ok());
  ASSERT_TRUE(eventually([&] { return seen.load() == 2; }));
  EXPECT_TRUE(log->contains("handler bug")) << log->all();
  EXPECT_EQ(b->stats().connections_closed, 0u);
}

// proves: X1
TEST(Transport, StartRefusesAnInvalidNodeIdAndUnusableSettings) {
  auto handler = [](std::string_view, std::uint32_t, std::string_view) {};
  const std::vector<std::function<void(TransportSettings&)>> changes = {
      [](TransportSettings& s) { s.node_id = "has space"; },
      [](TransportSettings& s) { s.node_id = ""; },
      [](TransportSettings& s) { s.max_frame_bytes = 10; },
      [](TransportSettings& s) { s.max_outbound_bytes = 0; },
      [](TransportSettings& s) { s.reconnect_max = 1ms; },
      [](TransportSettings& s) { s.keepalive_timeout = 1ms; },
      [](TransportSettings& s) { s.listen_host = "not an address"; },
  };
  for (const auto& change : changes) {
    TransportSettings s = test_settings("ok");
    change(s);
    auto r = Transport::start(s, handler);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument) << r.error().to_string();
  }
  EXPECT_FALSE(Transport::start(test_settings("ok"), nullptr).ok());
}

TEST(Transport, SetPeerIgnoresAnInvalidIdAndThisNodesOwnId) {
  Node a = Node::start("a");
  a->set_peer("not valid", "127.0.0.1", 1);
  a->set_peer("a", "127.0.0.1", a.port());
  EXPECT_TRUE(a->peers().empty());
  EXPECT_TRUE(a.log->wait_for("set_peer ignored: node id 'not valid'")) << a.log->all();
  EXPECT_TRUE(a.log->wait_for("set_peer ignored: 'a' is this node")) << a.log->all();
}

TEST(Transport, TheDefaultLogWritesOneLineWithTheNodeIdToTheLogFacade) {
  std::mutex mu;
  std::string lines;
  ASSERT_TRUE(troupe::log::configure({.sink = [&](std::string_view line) {
                                        std::lock_guard lk(mu);
                                        lines.append(line).push_back('\n');
                                      }})
                  .ok());
  {
    TransportSettings s;
    s.node_id = "solo";
    s.insecure = true;
    auto t = Transport::start(s, [](std::string_view, std::uint32_t, std::string_view) {}).value();
    t->set_peer("a b", "127.0.0.1", 1);
  }
  ASSERT_TRUE(troupe::log::configure({}).ok());
  std::lock_guard lk(mu);
  EXPECT_NE(lines.find("info  cluster set_peer ignored"), std::string::npos) << lines;
  EXPECT_NE(lines.find("transport=solo"), std::string::npos) << lines;
}

}  // namespace
}  // namespace troupe::cluster
