// The latency histogram: bucket layout, percentile precision, concurrent
// recording, interval snapshots and merging.

#include "troupe/node/latency_histogram.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

namespace troupe::node {
namespace {

TEST(LatencyHistogram, BucketsCoverEveryValueWithoutGapsOrOverlaps) {
  EXPECT_EQ(LatencyBuckets::index_of(0), 0u);
  EXPECT_EQ(LatencyBuckets::index_of(127), 127u);
  EXPECT_EQ(LatencyBuckets::index_of(128), 128u);
  for (std::size_t i = 1; i < LatencyBuckets::count; ++i) {
    ASSERT_EQ(LatencyBuckets::lower(i), LatencyBuckets::upper(i - 1) + 1) << i;
    ASSERT_EQ(LatencyBuckets::index_of(LatencyBuckets::lower(i)), i);
    ASSERT_EQ(LatencyBuckets::index_of(LatencyBuckets::upper(i)), i);
    // Precision: a bucket is at most 1/128 of its lower bound wide.
    ASSERT_LE(static_cast<double>(LatencyBuckets::upper(i) - LatencyBuckets::lower(i)),
              static_cast<double>(LatencyBuckets::lower(i)) / 128.0)
        << i;
  }
  EXPECT_EQ(LatencyBuckets::index_of(UINT64_MAX), LatencyBuckets::count - 1);
}

TEST(LatencyHistogram, SmallValuesAreExact) {
  LatencyHistogram h;
  for (std::uint64_t v = 1; v <= 100; ++v) h.record(v);
  const auto s = h.snapshot();
  EXPECT_EQ(s.count(), 100u);
  EXPECT_EQ(s.percentile(50), 50u);
  EXPECT_EQ(s.percentile(99), 99u);
  EXPECT_EQ(s.percentile(100), 100u);
  EXPECT_EQ(s.percentile(0), 1u);
  EXPECT_EQ(s.min(), 1u);
  EXPECT_DOUBLE_EQ(s.mean(), 50.5);
}

TEST(LatencyHistogram, PercentilesAreWithinOnePercentAndNeverBelowTheTruth) {
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> dist(8.0, 1.5);  // ~3 ms median, long tail
  std::vector<std::uint64_t> values;
  LatencyHistogram h;
  for (int i = 0; i < 200000; ++i) {
    const auto v = static_cast<std::uint64_t>(dist(rng));
    values.push_back(v);
    h.record(v);
  }
  std::sort(values.begin(), values.end());
  const auto s = h.snapshot();
  for (double p : {1.0, 10.0, 50.0, 90.0, 99.0, 99.9, 99.99}) {
    const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
    const std::uint64_t truth = values[rank - 1];
    const std::uint64_t got = s.percentile(p);
    EXPECT_GE(got, truth) << "p" << p;
    EXPECT_LE(static_cast<double>(got), static_cast<double>(truth) * 1.01 + 1) << "p" << p;
  }
  EXPECT_EQ(s.max(), values.back());
  EXPECT_EQ(s.percentile(100), values.back());
}

TEST(LatencyHistogram, RecordsFromManyThreadsWithoutLosingAValue) {
  LatencyHistogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < 50000; ++i) h.record(static_cast<std::uint64_t>(t * 1000 + i % 1000));
    });
  }
  for (auto& t : threads) t.join();
  const auto s = h.snapshot();
  EXPECT_EQ(s.count(), 200000u);
  EXPECT_EQ(h.count(), 200000u);
  EXPECT_EQ(s.min(), 0u);
  EXPECT_EQ(s.max(), 3999u);
}

TEST(LatencyHistogram, SnapshotAndResetGivesIntervalPercentiles) {
  LatencyHistogram h;
  for (int i = 0; i < 100; ++i) h.record(std::chrono::milliseconds(10));
  const auto first = h.snapshot_and_reset();
  for (int i = 0; i < 100; ++i) h.record(std::chrono::microseconds(50));
  const auto second = h.snapshot_and_reset();
  EXPECT_EQ(first.count(), 100u);
  EXPECT_NEAR(static_cast<double>(first.percentile(50)), 10000.0, 100.0);
  EXPECT_EQ(second.count(), 100u);
  EXPECT_EQ(second.percentile(99), 50u);
  EXPECT_EQ(second.max(), 50u);
  EXPECT_EQ(h.snapshot().count(), 0u);
  EXPECT_EQ(h.snapshot().percentile(99), 0u);
}

TEST(LatencyHistogram, MergesSnapshotsAndHistograms) {
  LatencyHistogram a;
  LatencyHistogram b;
  for (int i = 0; i < 90; ++i) a.record(100);
  for (int i = 0; i < 10; ++i) b.record(5000);
  auto merged = a.snapshot();
  merged.merge(b.snapshot());
  EXPECT_EQ(merged.count(), 100u);
  EXPECT_EQ(merged.percentile(90), 100u);
  EXPECT_GE(merged.percentile(91), 5000u);
  EXPECT_EQ(merged.max(), 5000u);
  a.merge(b.snapshot());
  EXPECT_EQ(a.count(), 100u);
  EXPECT_EQ(a.snapshot().percentile(95), merged.percentile(95));
  const auto bins = merged.bins();
  ASSERT_EQ(bins.size(), 2u);
  EXPECT_EQ(bins[0].count, 90u);
  EXPECT_LE(bins[1].lower, 5000u);
  EXPECT_GE(bins[1].upper, 5000u);
}

TEST(LatencyHistogram, ValuesBeyondTheRangeCountInTheLastBucketWithAnExactMax) {
  LatencyHistogram h;
  h.record(std::uint64_t{1} << 50);
  h.record(std::chrono::microseconds(-5));  // a clock that went backwards counts as 0
  const auto s = h.snapshot();
  EXPECT_EQ(s.count(), 2u);
  EXPECT_EQ(s.max(), std::uint64_t{1} << 50);
  EXPECT_EQ(s.percentile(100), std::uint64_t{1} << 50);
  EXPECT_EQ(s.percentile(50), 0u);
}

}  // namespace
}  // namespace troupe::node
