#pragma once
// Metrics in the Prometheus text exposition format (version 0.0.4), as the
// node's GET /metrics serves them.
//
// A scrape asks every registered collector to write what it knows into one
// MetricsWriter; the writer groups samples by family, so that two collectors
// may add samples to one family (each entity type adds its row to
// troupe_entities_active) and every family still appears once, with one
// HELP and one TYPE line, as the format requires.
//
//   troupe::node::Metrics metrics;
//   auto done = metrics.counter("payments_total", "Payments finished, by outcome.", {"outcome"});
//   done->add({"completed"});
//   metrics.add_collector([&](troupe::node::MetricsWriter& w) {
//     w.gauge("queue_depth", "Jobs waiting.").set({}, queue.size());
//   });
//   std::string text = metrics.scrape();
//
// Names and label names are checked when a family is declared (a bad one
// throws std::invalid_argument: it is a programming error, found at start).

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::node {

using Labels = std::vector<std::pair<std::string, std::string>>;

// One family's samples during a scrape. Owned by its MetricsWriter; used on
// the scraping thread only.
class MetricFamily {
 public:
  enum class Type { counter, gauge, histogram };

  // A counter's or gauge's sample. `labels` are name/value pairs.
  MetricFamily& set(const Labels& labels, double value);
  // A histogram's sample: cumulative counts per upper bound (`bounds` in
  // increasing order, without +Inf; `cumulative` one longer, its last entry
  // the total count), and the sum of the observed values.
  MetricFamily& observe(const Labels& labels, std::span<const double> bounds,
                        std::span<const std::uint64_t> cumulative, double sum);

 private:
  friend class MetricsWriter;
  MetricFamily(std::string name, Type type, std::string help);
  std::string name_;
  Type type_;
  std::string help_;
  std::string samples_;  // rendered sample lines
};

// Collects one scrape. Not thread-safe: one scrape, one thread.
class MetricsWriter {
 public:
  // The family `name` (declared by an earlier call with the same type if
  // there was one). Throws std::invalid_argument for a bad name, or a name
  // declared before with another type.
  MetricFamily& counter(std::string_view name, std::string_view help);
  MetricFamily& gauge(std::string_view name, std::string_view help);
  MetricFamily& histogram(std::string_view name, std::string_view help);

  // Adds every family and sample of `other` (throws like counter() on a
  // type clash).
  void merge(const MetricsWriter& other);

  // The exposition text, families in the order they were first declared.
  std::string text() const;

 private:
  MetricFamily& family(std::string_view name, MetricFamily::Type type, std::string_view help);
  std::vector<std::unique_ptr<MetricFamily>> families_;
  std::map<std::string, MetricFamily*, std::less<>> by_name_;
};

// A counter with fixed label names, updated from any thread (one atomic
// add per update). Created by Metrics::counter; shared with the registry.
class Counter {
 public:
  // Adds `n` to the series with these label values (as many as the label
  // names, in the same order).
  void add(const std::vector<std::string>& label_values, std::uint64_t n = 1);
  std::uint64_t value(const std::vector<std::string>& label_values) const;

 private:
  friend class Metrics;
  Counter(std::string name, std::string help, std::vector<std::string> label_names);
  void write(MetricsWriter& w) const;
  std::string name_, help_;
  std::vector<std::string> label_names_;
  mutable std::mutex mu_;  // guards the map's shape; values are atomic
  std::map<std::vector<std::string>, std::unique_ptr<std::atomic<std::uint64_t>>> series_;
};

// Latencies in fixed buckets (seconds), updated from any thread without a
// lock. Created by Metrics::histogram.
class Histogram {
 public:
  void observe_seconds(double seconds);
  // Cumulative counts per bound, the last entry the total (for
  // quantile estimates over an interval: subtract two snapshots).
  std::vector<std::uint64_t> cumulative() const;
  const std::vector<double>& bounds() const noexcept { return bounds_; }
  double sum() const;

 private:
  friend class Metrics;
  Histogram(std::string name, std::string help, std::vector<double> bounds);
  void write(MetricsWriter& w) const;
  std::string name_, help_;
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;  // one per bound, plus +Inf
  std::atomic<std::uint64_t> sum_micros_{0};
};

// The registry a node scrapes. Thread-safe: collectors and metrics may be
// added while scrapes run; a collector runs on the scraping thread and must
// not block for long. Owns the counters and histograms it created (shared
// with their users).
class Metrics {
 public:
  // Latency buckets, in seconds: 0.5 ms to 30 s.
  static std::vector<double> default_latency_bounds();

  std::shared_ptr<Counter> counter(std::string name, std::string help, std::vector<std::string> label_names = {});
  std::shared_ptr<Histogram> histogram(std::string name, std::string help,
                                       std::vector<double> bounds = default_latency_bounds());
  // Runs at every scrape, in the order added. Returns an id for remove_collector.
  std::uint64_t add_collector(std::function<void(MetricsWriter&)> collect);
  void remove_collector(std::uint64_t id);

  // The whole exposition. A collector that throws is skipped and counted in
  // troupe_metrics_collector_failures_total.
  std::string scrape() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Counter>> counters_;
  std::vector<std::shared_ptr<Histogram>> histograms_;
  std::vector<std::pair<std::uint64_t, std::function<void(MetricsWriter&)>>> collectors_;
  std::uint64_t next_id_ = 1;
  mutable std::atomic<std::uint64_t> collector_failures_{0};
};

// Whether `name` is a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) or,
// without colons, a label name.
bool valid_metric_name(std::string_view name) noexcept;
bool valid_label_name(std::string_view name) noexcept;

}  // namespace troupe::node
