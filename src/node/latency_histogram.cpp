// The latency histogram; see latency_histogram.hpp for the bucket layout
// and its precision.

#include "troupe/node/latency_histogram.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::node {

namespace {

void store_min(std::atomic<std::uint64_t>& a, std::uint64_t v) noexcept {
  std::uint64_t cur = a.load(std::memory_order_relaxed);
  while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void store_max(std::atomic<std::uint64_t>& a, std::uint64_t v) noexcept {
  std::uint64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

// --- snapshot ---------------------------------------------------------------------

std::uint64_t HistogramSnapshot::percentile(double percent) const noexcept {
  if (count_ == 0) return 0;
  if (!(percent > 0.0)) return min();  // also NaN
  if (percent >= 100.0) return max_;
  // The value with rank ceil(p% of count), 1-based.
  auto rank = static_cast<std::uint64_t>(std::ceil(percent / 100.0 * static_cast<double>(count_)));
  rank = std::clamp<std::uint64_t>(rank, 1, count_);
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen >= rank) {
      // The bucket's highest value, but never past the exact extremes
      // (checked against the bucket, as a snapshot taken during recording
      // may hold a bucket count whose extremes it missed).
      std::uint64_t v = LatencyBuckets::upper(i);
      if (max_ >= LatencyBuckets::lower(i)) v = std::min(v, max_);
      if (min_ <= LatencyBuckets::upper(i)) v = std::max(v, min_);
      return v;
    }
  }
  return max_;
}

void HistogramSnapshot::merge(const HistogramSnapshot& other) noexcept {
  for (std::size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
}

std::vector<HistogramSnapshot::Bin> HistogramSnapshot::bins() const {
  std::vector<Bin> out;
  for (std::size_t i = 0; i < counts_.size(); ++i)
    if (counts_[i] != 0) out.push_back(Bin{LatencyBuckets::lower(i), LatencyBuckets::upper(i), counts_[i]});
  return out;
}

// --- recorder ---------------------------------------------------------------------

void LatencyHistogram::record(std::uint64_t micros) noexcept {
  buckets_[LatencyBuckets::index_of(micros)].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(micros, std::memory_order_relaxed);
  store_min(min_, micros);
  store_max(max_, micros);
}

HistogramSnapshot LatencyHistogram::snapshot() const {
  HistogramSnapshot s;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    s.counts_[i] = buckets_[i].load(std::memory_order_relaxed);
    s.count_ += s.counts_[i];
  }
  s.sum_ = sum_.load(std::memory_order_relaxed);
  s.min_ = min_.load(std::memory_order_relaxed);
  s.max_ = max_.load(std::memory_order_relaxed);
  return s;
}

HistogramSnapshot LatencyHistogram::snapshot_and_reset() {
  HistogramSnapshot s;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    s.counts_[i] = buckets_[i].exchange(0, std::memory_order_relaxed);
    s.count_ += s.counts_[i];
  }
  count_.fetch_sub(std::min(s.count_, count_.load(std::memory_order_relaxed)), std::memory_order_relaxed);
  s.sum_ = sum_.exchange(0, std::memory_order_relaxed);
  s.min_ = min_.exchange(UINT64_MAX, std::memory_order_relaxed);
  s.max_ = max_.exchange(0, std::memory_order_relaxed);
  // A value recorded between the bucket exchanges and these may have put
  // its extremes in the wrong interval; keep them within the buckets taken.
  if (s.count_ == 0) {
    s.min_ = UINT64_MAX;
    s.max_ = 0;
  }
  return s;
}

void LatencyHistogram::merge(const HistogramSnapshot& other) noexcept {
  for (std::size_t i = 0; i < buckets_.size(); ++i)
    if (other.counts_[i] != 0) buckets_[i].fetch_add(other.counts_[i], std::memory_order_relaxed);
  count_.fetch_add(other.count_, std::memory_order_relaxed);
  sum_.fetch_add(other.sum_, std::memory_order_relaxed);
  if (other.count_ != 0) {
    store_min(min_, other.min_);
    store_max(max_, other.max_);
  }
}

}  // namespace troupe::node
