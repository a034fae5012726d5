#pragma once
// A latency histogram in the manner of HdrHistogram: microsecond values in
// log-spaced buckets with linear sub-buckets, fixed memory, lock-free
// recording.
//
// Buckets: values below 128 µs each have their own bucket (exact). Above,
// every power of two [2^e, 2^(e+1)) is split into 128 equal sub-buckets, so
// a bucket's width is at most 1/128 of its lower bound: a percentile is
// reported as the highest value of its bucket, at most 0.8% above the true
// value (never below it), and never above the exact maximum. Values up to
// 2^40 µs (about 12.7 days) are bucketed; larger ones count in the last
// bucket (max() stays exact). 4352 buckets: 34 KiB per histogram.
//
//   troupe::node::LatencyHistogram h;
//   h.record(std::chrono::microseconds(1234));          // any thread
//   auto s = h.snapshot();
//   std::printf("p99 %.2f ms\n", s.percentile(99) / 1000.0);
//   auto last_second = interval.snapshot_and_reset();   // interval percentiles

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::node {

// The bucket layout, shared by the recorder and its snapshots.
struct LatencyBuckets {
  static constexpr int sub_bits = 7;
  static constexpr std::uint64_t sub_count = 1u << sub_bits;  // 128
  static constexpr int max_exponent = 40;                     // values < 2^40 µs are bucketed
  static constexpr std::size_t count = sub_count + (max_exponent - sub_bits) * sub_count;

  // The bucket of a value in microseconds.
  static constexpr std::size_t index_of(std::uint64_t micros) noexcept {
    if (micros < sub_count) return static_cast<std::size_t>(micros);
    int e = 63;
    while (!(micros >> e)) --e;  // highest set bit, >= sub_bits
    if (e >= max_exponent) return count - 1;
    const std::uint64_t sub = (micros >> (e - sub_bits)) - sub_count;
    return static_cast<std::size_t>(sub_count + static_cast<std::uint64_t>(e - sub_bits) * sub_count + sub);
  }
  // The smallest and largest value a bucket holds.
  static constexpr std::uint64_t lower(std::size_t index) noexcept {
    if (index < sub_count) return index;
    const std::uint64_t b = index - sub_count;
    const std::uint64_t shift = b / sub_count;
    return (sub_count + b % sub_count) << shift;
  }
  static constexpr std::uint64_t upper(std::size_t index) noexcept {
    if (index < sub_count) return index;
    const std::uint64_t shift = (index - sub_count) / sub_count;
    return lower(index) + (std::uint64_t{1} << shift) - 1;
  }
};

// What a histogram held at one moment: plain counts and the queries.
// Value type; no thread safety of its own.
class HistogramSnapshot {
 public:
  HistogramSnapshot() : counts_(LatencyBuckets::count, 0) {}

  std::uint64_t count() const noexcept { return count_; }
  std::uint64_t sum() const noexcept { return sum_; }  // microseconds
  std::uint64_t min() const noexcept { return count_ ? min_ : 0; }
  std::uint64_t max() const noexcept { return max_; }
  double mean() const noexcept {
    return count_ ? static_cast<double>(sum_) / static_cast<double>(count_) : 0.0;
  }

  // The value (µs) at or below which `percent` (0..100) of the values lie,
  // as described at the top of the file; 0 when empty. percentile(100) is
  // max(), percentile(0) is min().
  std::uint64_t percentile(double percent) const noexcept;

  // Adds another snapshot's values.
  void merge(const HistogramSnapshot& other) noexcept;

  // The non-empty buckets in increasing order: [lower, upper] in µs.
  struct Bin {
    std::uint64_t lower = 0;
    std::uint64_t upper = 0;
    std::uint64_t count = 0;
  };
  std::vector<Bin> bins() const;

 private:
  friend class LatencyHistogram;
  std::vector<std::uint64_t> counts_;
  std::uint64_t count_ = 0;
  std::uint64_t sum_ = 0;
  std::uint64_t min_ = UINT64_MAX;
  std::uint64_t max_ = 0;
};

// Records latencies from any number of threads. Ownership: a plain object
// (not copyable; hold it where its recorders can reach it). Thread safety:
// record() and every other member may be called concurrently; each counter
// is a relaxed atomic, so a snapshot taken while others record is
// consistent per bucket but may count a value in `count` and not yet in its
// bucket, or the reverse (percentiles are computed from the buckets alone).
class LatencyHistogram {
 public:
  LatencyHistogram() = default;
  LatencyHistogram(const LatencyHistogram&) = delete;
  LatencyHistogram& operator=(const LatencyHistogram&) = delete;

  void record(std::uint64_t micros) noexcept;
  template <class Rep, class Period>
  void record(std::chrono::duration<Rep, Period> d) noexcept {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
    record(us < 0 ? std::uint64_t{0} : static_cast<std::uint64_t>(us));
  }

  HistogramSnapshot snapshot() const;
  // The values since the last reset, and a reset: each bucket is taken
  // with one atomic exchange, so a value recorded meanwhile lands in
  // exactly one of the two intervals.
  HistogramSnapshot snapshot_and_reset();
  void merge(const HistogramSnapshot& other) noexcept;
  void reset() noexcept { (void)snapshot_and_reset(); }

  std::uint64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }
  std::uint64_t max() const noexcept { return max_.load(std::memory_order_relaxed); }
  std::uint64_t percentile(double percent) const { return snapshot().percentile(percent); }

 private:
  std::array<std::atomic<std::uint64_t>, LatencyBuckets::count> buckets_{};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_{0};
  std::atomic<std::uint64_t> min_{UINT64_MAX};
  std::atomic<std::uint64_t> max_{0};
};

}  // namespace troupe::node
