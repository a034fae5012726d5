// The history checker of the multi-node tests (SPEC V1) on histories made
// up here: it must see two live incarnations, a balance answered twice and
// a lost write, and must not complain about a clean run, a frozen process
// or a write whose outcome is unknown.

#include "history_checker.hpp"

#include <gtest/gtest.h>

#include <sstream>

namespace troupe::cluster::proc {
namespace {

using namespace std::chrono_literals;

constexpr WallUs kMs = 1000;  // microseconds per millisecond
constexpr auto kMargin = 300ms;

ClientOp deposit(const std::string& entity, const std::string& via, WallUs at_ms, std::optional<std::int64_t> balance) {
  return ClientOp{entity, via, "", at_ms * kMs, (at_ms + 5) * kMs, balance};
}
Activation activation(const std::string& node, long pid, WallUs from_ms, std::optional<WallUs> to_ms) {
  return Activation{"a", node, pid, 1, from_ms * kMs, to_ms ? std::optional<WallUs>(*to_ms * kMs) : std::nullopt};
}
NodeSignal signal(NodeSignal::Kind k, const std::string& node, long pid, WallUs at_ms) {
  return NodeSignal{k, node, pid, at_ms * kMs};
}

// A history with nothing wrong: three deposits answered 1, 2, 3 in order by
// two nodes; the entity ran on n1, then (after n1 was killed) on n2.
HistoryRecord clean() {
  HistoryRecord r;
  r.client = {deposit("a", "n1", 0, 1), deposit("a", "n2", 100, 2), deposit("a", "n2", 3000, 3)};
  r.activations = {activation("n1", 11, 0, std::nullopt), activation("n2", 12, 2500, std::nullopt)};
  r.signals = {signal(NodeSignal::Kind::kill, "n1", 11, 1000)};
  r.stored = {{"a", "n1", 1, 1, 1}, {"a", "n1", 1, 2, 1}, {"a", "n2", 2, 3, 1}};
  r.journal_highest = {{"a", 3}};
  r.taken = 4000 * kMs;
  return r;
}

std::string all(const std::vector<std::string>& v) {
  std::string out;
  for (auto& s : v) out += s + "\n";
  return out;
}

// proves: V1
TEST(HistoryChecker, ACleanHistoryHasNoViolation) {
  auto v = check_history(clean(), kMargin);
  EXPECT_TRUE(v.empty()) << all(v);
}

// proves: V1
TEST(HistoryChecker, TwoOverlappingIncarnationsOnTwoNodesAreAViolation) {
  auto r = clean();
  // n1 is not killed: its incarnation lives on past n2's start, 1.5 s both.
  r.signals.clear();
  r.activations[0].stopped = 4000 * kMs;
  auto v = check_history(r, kMargin);
  ASSERT_EQ(v.size(), 1u) << all(v);
  EXPECT_NE(v[0].find("two live incarnations"), std::string::npos) << v[0];
  // The same with no stop line and no kill: active until the record was taken.
  r.activations[0].stopped.reset();
  EXPECT_EQ(check_history(r, kMargin).size(), 1u);
}

// proves: V1
TEST(HistoryChecker, AnOverlapWithinTheMarginIsNoViolation) {
  auto r = clean();
  r.signals.clear();
  r.activations[0].stopped = 2500 * kMs + 200 * kMs;  // 200 ms beside n2's
  EXPECT_TRUE(check_history(r, kMargin).empty());
  r.activations[0].stopped = 2500 * kMs + 400 * kMs;
  EXPECT_EQ(check_history(r, kMargin).size(), 1u);
}

// proves: V1
TEST(HistoryChecker, AnOverlapInsideARecordedPauseIsNoViolation) {
  auto r = clean();
  // n1 frozen from 1000 to 3800 ms, then its incarnation stops at once:
  // 100 ms of it beside n2's live one, within the margin.
  r.signals = {signal(NodeSignal::Kind::pause, "n1", 11, 1000), signal(NodeSignal::Kind::resume, "n1", 11, 3800)};
  r.activations[0].stopped = 3900 * kMs;
  auto v = check_history(r, kMargin);
  EXPECT_TRUE(v.empty()) << all(v);
  // Woken, it lives on for another second beside n2's: a violation.
  r.activations[0].stopped = 4800 * kMs;
  r.taken = 5000 * kMs;
  EXPECT_EQ(check_history(r, kMargin).size(), 1u);
  // Frozen and never woken, then killed: no violation.
  r.signals = {signal(NodeSignal::Kind::pause, "n1", 11, 1000), signal(NodeSignal::Kind::kill, "n1", 11, 4500)};
  r.activations[0].stopped.reset();
  EXPECT_TRUE(check_history(r, kMargin).empty());
}

// proves: V1
TEST(HistoryChecker, OneProcessRestartedUnderTheSameNodeIdIsTwoProcesses) {
  auto r = clean();
  // n1 killed at 1000 ms and started again (pid 13); its new incarnation
  // overlaps n2's by seconds.
  r.activations.push_back(activation("n1", 13, 2000, std::nullopt));
  EXPECT_EQ(check_history(r, kMargin).size(), 1u);
}

// proves: V1
TEST(HistoryChecker, ADuplicatedAnsweredBalanceIsAViolation) {
  auto r = clean();
  r.client.push_back(deposit("a", "n1", 3500, 3));  // a second writer answered 3 too
  r.client.push_back(deposit("a", "n1", 3600, 4));
  r.journal_highest["a"] = 4;
  auto v = check_history(r, kMargin);
  ASSERT_FALSE(v.empty());
  EXPECT_NE(all(v).find("balance 3 answered twice"), std::string::npos) << all(v);
}

// proves: V1
TEST(HistoryChecker, AGapWithNoUnknownOutcomeIsAViolation) {
  auto r = clean();
  r.client[1].balance = 3;  // answers 1, 3, then 4: 2 was never answered
  r.client[2].balance = 4;
  r.journal_highest["a"] = 4;
  auto v = check_history(r, kMargin);
  ASSERT_EQ(v.size(), 1u) << all(v);
  EXPECT_NE(v[0].find("miss 1 (2)"), std::string::npos) << v[0];
}

// proves: V1
TEST(HistoryChecker, AGapCoveredByATimedOutAttemptIsNoViolation) {
  auto r = clean();
  r.client[1].balance = 3;
  r.client[2].balance = 4;
  r.client.push_back(deposit("a", "n2", 50, std::nullopt));  // timed out: it may have stored 2
  r.journal_highest["a"] = 4;
  auto v = check_history(r, kMargin);
  EXPECT_TRUE(v.empty()) << all(v);
}

// proves: V1
TEST(HistoryChecker, ALowerBalanceAnsweredAfterAHigherOneIsAViolation) {
  auto r = clean();
  r.client[0].balance = 2;  // answered 2 at 5 ms; the deposit asked at 100 ms answered 1
  r.client[1].balance = 1;
  auto v = check_history(r, kMargin);
  ASSERT_EQ(v.size(), 1u) << all(v);
  EXPECT_NE(v[0].find("not linearizable"), std::string::npos) << v[0];
}

// proves: V1
TEST(HistoryChecker, AnAcknowledgedWriteMissingFromTheJournalIsAViolation) {
  auto r = clean();
  r.journal_highest["a"] = 2;
  auto v = check_history(r, kMargin);
  ASSERT_EQ(v.size(), 1u) << all(v);
  EXPECT_NE(v[0].find("missing"), std::string::npos) << v[0];
}

// proves: V1
TEST(HistoryChecker, ACreditOpAnsweredTwiceMustAnswerTheSameBalance) {
  HistoryRecord r;
  auto credit = [](const std::string& op, WallUs at_ms, std::optional<std::int64_t> b) {
    return ClientOp{"c", "n1", op, at_ms * kMs, (at_ms + 5) * kMs, b};
  };
  // op x answered twice (a re-ask after a failover) with 1; y answered 2.
  r.client = {credit("x", 0, 1), credit("x", 10, 1), credit("y", 20, 2)};
  r.taken = 100 * kMs;
  auto v = check_history(r, kMargin);
  EXPECT_TRUE(v.empty()) << all(v);
  r.client.push_back(credit("x", 30, 3));  // x applied a second time
  v = check_history(r, kMargin);
  ASSERT_FALSE(v.empty());
  EXPECT_NE(all(v).find("credit x answered balance 1 and later 3"), std::string::npos) << all(v);
  r.client.pop_back();
  r.client.push_back(credit("z", 30, 2));  // distinct ops share a balance
  v = check_history(r, kMargin);
  ASSERT_FALSE(v.empty());
  EXPECT_NE(all(v).find("balance 2 answered twice"), std::string::npos) << all(v);
}

// proves: V1
TEST(HistoryChecker, JournalSideSeqStoredTwiceOrInterleavedIsAViolation) {
  auto r = clean();
  r.stored.push_back({"a", "n2", 2, 2, 1});  // n2's incarnation stored seq 2 again
  auto v = check_history(r, kMargin);
  EXPECT_NE(all(v).find("seq 2 stored twice"), std::string::npos) << all(v);
  EXPECT_NE(all(v).find("interleaved"), std::string::npos) << all(v);
}

TEST(HistoryChecker, ReadsTheNodesActivationLog) {
  std::istringstream in(
      "start a n1 11 7 1000\n"
      "start b n1 11 8 1100\n"
      "stop a n1 11 7 2000\n"
      "garbage\n");
  std::vector<Activation> out;
  read_activations(in, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].entity, "a");
  EXPECT_EQ(out[0].pid, 11);
  EXPECT_EQ(out[0].started, 1000);
  EXPECT_EQ(out[0].stopped, std::optional<WallUs>(2000));
  EXPECT_FALSE(out[1].stopped.has_value());
}

}  // namespace
}  // namespace troupe::cluster::proc
