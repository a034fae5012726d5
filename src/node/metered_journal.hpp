#pragma once
// MeteredJournal: the journal decorator the node puts in front of its back
// end, counting and timing appends for /metrics. Private to the node.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "troupe/node/metrics.hpp"
#include "troupe/persist/forwarding_journal.hpp"

namespace troupe::node::detail {

using Clock = std::chrono::steady_clock;

// Counts and times the journal's appends for /metrics; forwards everything.
class MeteredJournal final : public ForwardingJournal {
 public:
  // What the appends add up to. Shared with their callbacks: the back end,
  // destroyed after this object's own members, may still complete appends.
  struct Meters {
    explicit Meters(std::shared_ptr<Histogram> l) : latency(std::move(l)) {}
    std::shared_ptr<Histogram> latency;
    std::atomic<std::uint64_t> events{0}, appends{0}, failures{0};
  };

  MeteredJournal(std::shared_ptr<Journal> inner, std::shared_ptr<Histogram> latency)
      : ForwardingJournal(std::move(inner)), meters_(std::make_shared<Meters>(std::move(latency))) {}

  void append(AppendBatch batch, Callback<void> done) override {
    meters_->events.fetch_add(batch.events.size(), std::memory_order_relaxed);
    meters_->appends.fetch_add(1, std::memory_order_relaxed);
    auto start = Clock::now();
    inner().append(std::move(batch), [m = meters_, start, done = std::move(done)](Result<void> r) mutable {
      m->latency->observe_seconds(std::chrono::duration<double>(Clock::now() - start).count());
      if (!r.ok()) m->failures.fetch_add(1, std::memory_order_relaxed);
      done(std::move(r));
    });
  }
  // Group commits of the back end, when it reports them: {transactions, events}.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> commits() const {
    const JournalStats st = journal_stats();
    if (!st.transactions || !st.events_written) return std::nullopt;
    return std::pair{*st.transactions, *st.events_written};
  }
  const Meters& meters() const noexcept { return *meters_; }

 private:
  std::shared_ptr<Meters> meters_;
};

}  // namespace troupe::node::detail
