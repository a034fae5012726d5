// Prometheus text exposition: see include/troupe/node/metrics.hpp.

#include "troupe/node/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace troupe::node {

namespace {

bool name_char(char c, bool first, bool colon) {
  bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
  return alpha || (!first && c >= '0' && c <= '9');
}

bool valid_name(std::string_view name, bool colon) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i)
    if (!name_char(name[i], i == 0, colon)) return false;
  return true;
}

// A sample value as the format spells it: integers exactly, NaN and the
// infinities by name.
void append_value(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    out += buf;
  } else {
    // The shortest of 15 or 17 digits that reads back as the same double.
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.15g", v);
    if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
    out += buf;
  }
}

// Label values escape backslash, double quote and line feed; HELP text
// escapes backslash and line feed.
void append_escaped(std::string& out, std::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

void append_labels(std::string& out, const Labels& labels, const std::pair<std::string, std::string>* extra) {
  if (labels.empty() && !extra) return;
  out += '{';
  bool first = true;
  auto one = [&](const std::pair<std::string, std::string>& l) {
    if (!valid_label_name(l.first)) throw std::invalid_argument("bad metric label name '" + l.first + "'");
    if (!first) out += ',';
    first = false;
    out += l.first;
    out += "=\"";
    append_escaped(out, l.second, true);
    out += '"';
  };
  for (const auto& l : labels) one(l);
  if (extra) one(*extra);
  out += '}';
}

std::string bound_text(double b) {
  std::string s;
  append_value(s, b);
  return s;
}

}  // namespace

bool valid_metric_name(std::string_view name) noexcept { return valid_name(name, true); }
bool valid_label_name(std::string_view name) noexcept { return valid_name(name, false) && !name.starts_with("__"); }

// --- MetricFamily ----------------------------------------------------------------

MetricFamily::MetricFamily(std::string name, Type type, std::string help)
    : name_(std::move(name)), type_(type), help_(std::move(help)) {}

MetricFamily& MetricFamily::set(const Labels& labels, double value) {
  if (type_ == Type::histogram) throw std::invalid_argument("metric '" + name_ + "' is a histogram: use observe()");
  samples_ += name_;
  append_labels(samples_, labels, nullptr);
  samples_ += ' ';
  append_value(samples_, value);
  samples_ += '\n';
  return *this;
}

MetricFamily& MetricFamily::observe(const Labels& labels, std::span<const double> bounds,
                                    std::span<const std::uint64_t> cumulative, double sum) {
  if (type_ != Type::histogram) throw std::invalid_argument("metric '" + name_ + "' is not a histogram");
  if (cumulative.size() != bounds.size() + 1)
    throw std::invalid_argument("metric '" + name_ + "': one count per bound, plus the total");
  for (std::size_t i = 0; i <= bounds.size(); ++i) {
    std::pair<std::string, std::string> le{"le", i < bounds.size() ? bound_text(bounds[i]) : "+Inf"};
    samples_ += name_;
    samples_ += "_bucket";
    append_labels(samples_, labels, &le);
    samples_ += ' ';
    append_value(samples_, static_cast<double>(cumulative[i]));
    samples_ += '\n';
  }
  samples_ += name_;
  samples_ += "_sum";
  append_labels(samples_, labels, nullptr);
  samples_ += ' ';
  append_value(samples_, sum);
  samples_ += '\n';
  samples_ += name_;
  samples_ += "_count";
  append_labels(samples_, labels, nullptr);
  samples_ += ' ';
  append_value(samples_, static_cast<double>(cumulative.back()));
  samples_ += '\n';
  return *this;
}

// --- MetricsWriter ---------------------------------------------------------------

MetricFamily& MetricsWriter::counter(std::string_view name, std::string_view help) {
  return family(name, MetricFamily::Type::counter, help);
}
MetricFamily& MetricsWriter::gauge(std::string_view name, std::string_view help) {
  return family(name, MetricFamily::Type::gauge, help);
}
MetricFamily& MetricsWriter::histogram(std::string_view name, std::string_view help) {
  return family(name, MetricFamily::Type::histogram, help);
}

MetricFamily& MetricsWriter::family(std::string_view name, MetricFamily::Type type, std::string_view help) {
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    if (it->second->type_ != type)
      throw std::invalid_argument("metric '" + std::string(name) + "' declared twice with different types");
    return *it->second;
  }
  if (!valid_metric_name(name)) throw std::invalid_argument("bad metric name '" + std::string(name) + "'");
  families_.push_back(std::unique_ptr<MetricFamily>(new MetricFamily(std::string(name), type, std::string(help))));
  by_name_.emplace(std::string(name), families_.back().get());
  return *families_.back();
}

void MetricsWriter::merge(const MetricsWriter& other) {
  for (const auto& f : other.families_) family(f->name_, f->type_, f->help_).samples_ += f->samples_;
}

std::string MetricsWriter::text() const {
  std::string out;
  for (const auto& f : families_) {
    out += "# HELP ";
    out += f->name_;
    out += ' ';
    append_escaped(out, f->help_, false);
    out += "\n# TYPE ";
    out += f->name_;
    switch (f->type_) {
      case MetricFamily::Type::counter: out += " counter\n"; break;
      case MetricFamily::Type::gauge: out += " gauge\n"; break;
      case MetricFamily::Type::histogram: out += " histogram\n"; break;
    }
    out += f->samples_;
  }
  return out;
}

// --- Counter ---------------------------------------------------------------------

Counter::Counter(std::string name, std::string help, std::vector<std::string> label_names)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)) {
  if (!valid_metric_name(name_)) throw std::invalid_argument("bad metric name '" + name_ + "'");
  for (const auto& l : label_names_)
    if (!valid_label_name(l)) throw std::invalid_argument("bad label name '" + l + "' of metric '" + name_ + "'");
}

void Counter::add(const std::vector<std::string>& label_values, std::uint64_t n) {
  if (label_values.size() != label_names_.size())
    throw std::invalid_argument("metric '" + name_ + "' takes " + std::to_string(label_names_.size()) + " labels");
  std::atomic<std::uint64_t>* cell = nullptr;
  {
    std::lock_guard lk(mu_);
    auto& slot = series_[label_values];
    if (!slot) slot = std::make_unique<std::atomic<std::uint64_t>>(0);
    cell = slot.get();
  }
  cell->fetch_add(n, std::memory_order_relaxed);
}

std::uint64_t Counter::value(const std::vector<std::string>& label_values) const {
  std::lock_guard lk(mu_);
  auto it = series_.find(label_values);
  return it == series_.end() ? 0 : it->second->load(std::memory_order_relaxed);
}

void Counter::write(MetricsWriter& w) const {
  auto& f = w.counter(name_, help_);
  std::lock_guard lk(mu_);
  for (const auto& [values, cell] : series_) {
    Labels labels;
    for (std::size_t i = 0; i < values.size(); ++i) labels.emplace_back(label_names_[i], values[i]);
    f.set(labels, static_cast<double>(cell->load(std::memory_order_relaxed)));
  }
}

// --- Histogram -------------------------------------------------------------------

Histogram::Histogram(std::string name, std::string help, std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      bounds_(std::move(bounds)),
      counts_(new std::atomic<std::uint64_t>[bounds_.size() + 1]) {
  if (!valid_metric_name(name_)) throw std::invalid_argument("bad metric name '" + name_ + "'");
  if (bounds_.empty() || !std::is_sorted(bounds_.begin(), bounds_.end()) ||
      std::adjacent_find(bounds_.begin(), bounds_.end()) != bounds_.end())
    throw std::invalid_argument("histogram '" + name_ + "' needs increasing bounds");
  for (std::size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe_seconds(double seconds) {
  if (!(seconds >= 0)) seconds = 0;  // NaN and negatives count as 0
  auto i = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_micros_.fetch_add(static_cast<std::uint64_t>(std::llround(seconds * 1e6)), std::memory_order_relaxed);
}

std::vector<std::uint64_t> Histogram::cumulative() const {
  std::vector<std::uint64_t> out(bounds_.size() + 1);
  std::uint64_t run = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    run += counts_[i].load(std::memory_order_relaxed);
    out[i] = run;
  }
  return out;
}

double Histogram::sum() const { return static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6; }

void Histogram::write(MetricsWriter& w) const {
  auto c = cumulative();
  w.histogram(name_, help_).observe({}, bounds_, c, sum());
}

// --- Metrics ---------------------------------------------------------------------

std::vector<double> Metrics::default_latency_bounds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}

std::shared_ptr<Counter> Metrics::counter(std::string name, std::string help, std::vector<std::string> label_names) {
  std::shared_ptr<Counter> c(new Counter(std::move(name), std::move(help), std::move(label_names)));
  std::lock_guard lk(mu_);
  counters_.push_back(c);
  return c;
}

std::shared_ptr<Histogram> Metrics::histogram(std::string name, std::string help, std::vector<double> bounds) {
  std::shared_ptr<Histogram> h(new Histogram(std::move(name), std::move(help), std::move(bounds)));
  std::lock_guard lk(mu_);
  histograms_.push_back(h);
  return h;
}

std::uint64_t Metrics::add_collector(std::function<void(MetricsWriter&)> collect) {
  std::lock_guard lk(mu_);
  auto id = next_id_++;
  collectors_.emplace_back(id, std::move(collect));
  return id;
}

void Metrics::remove_collector(std::uint64_t id) {
  std::lock_guard lk(mu_);
  std::erase_if(collectors_, [&](const auto& c) { return c.first == id; });
}

std::string Metrics::scrape() const {
  std::vector<std::shared_ptr<Counter>> counters;
  std::vector<std::shared_ptr<Histogram>> histograms;
  std::vector<std::function<void(MetricsWriter&)>> collectors;
  {
    std::lock_guard lk(mu_);
    counters = counters_;
    histograms = histograms_;
    for (const auto& c : collectors_) collectors.push_back(c.second);
  }
  MetricsWriter w;
  for (const auto& collect : collectors) {
    // A collector that fails must not cost the others their samples, so
    // it writes into a writer of its own first.
    try {
      MetricsWriter own;
      collect(own);
      w.merge(own);
    } catch (...) {
      collector_failures_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  for (const auto& c : counters) c->write(w);
  for (const auto& h : histograms) h->write(w);
  w.counter("troupe_metrics_collector_failures_total", "Metric collectors that threw during a scrape.")
      .set({}, static_cast<double>(collector_failures_.load(std::memory_order_relaxed)));
  return w.text();
}

}  // namespace troupe::node
