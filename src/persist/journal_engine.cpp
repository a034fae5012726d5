#include "journal_engine.hpp"

#include <atomic>

namespace troupe::detail {

GroupCommit::GroupCommit(std::vector<std::unique_ptr<JournalLane>> lanes, std::size_t max_weight,
                         std::function<Error()> closed_error)
    : max_weight_(max_weight), closed_error_(std::move(closed_error)) {
  for (auto& w : lanes) {
    auto lane = std::make_unique<Lane>();
    lane->writer = std::move(w);
    lanes_.push_back(std::move(lane));
  }
}

GroupCommit::~GroupCommit() {
  close();
  join();
}

std::size_t GroupCommit::lane_of(const std::string& key) const noexcept {
  if (lanes_.size() == 1) return 0;
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a: stable and cheap
  for (char c : key) {
    h ^= static_cast<std::uint8_t>(c);
    h *= 1099511628211ull;
  }
  return static_cast<std::size_t>(h % lanes_.size());
}

void GroupCommit::start(std::shared_ptr<void> keep_alive) {
  for (auto& l : lanes_) {
    Lane* lane = l.get();
    lane->thread = std::thread([this, keep_alive, lane] { run(*lane); });
  }
}

void GroupCommit::submit(JournalWrite&& op) {
  Lane& lane = *lanes_[lane_of(op.key())];
  bool queued = false, wake = false;
  {
    std::lock_guard lk(lane.mu);
    if (!lane.closed) {
      lane.queue.push_back(std::move(op));
      queued = true;
      // Only an idle lane needs a signal; a busy one swaps its queue when
      // its transaction ends. This keeps notify off the append path.
      wake = lane.idle;
      lane.idle = false;
    }
  }
  if (!queued) {
    if (op.done) op.done(closed_error_());
    return;
  }
  if (wake) lane.cv.notify_one();
}

void GroupCommit::close() {
  for (auto& l : lanes_) {
    {
      std::lock_guard lk(l->mu);
      l->closed = true;
    }
    l->cv.notify_one();
  }
}

void GroupCommit::join() {
  const auto me = std::this_thread::get_id();
  for (auto& l : lanes_) {
    if (l->thread.get_id() == me)
      l->thread.detach();  // closed from our own callback: this thread finishes and frees the state
    else if (l->thread.joinable())
      l->thread.join();
  }
}

void GroupCommit::run(Lane& lane) {
  std::vector<JournalWrite> ops;
  std::vector<Result<void>> results;
  for (;;) {
    {
      std::unique_lock lk(lane.mu);
      while (lane.queue.empty() && !lane.closed) {
        lane.idle = true;
        lane.cv.wait(lk);
      }
      lane.idle = false;
      if (lane.queue.empty()) return;  // closed and drained
      // The whole queue in one swap: one lock round trip per transaction,
      // not per append. `ops` is empty and keeps its capacity.
      ops.swap(lane.queue);
    }
    std::size_t begin = 0;
    while (begin < ops.size()) {
      std::size_t end = begin;
      std::size_t weight = ops[end++].weight();
      while (end < ops.size() && weight + ops[end].weight() <= max_weight_) weight += ops[end++].weight();
      results.assign(end - begin, Result<void>());
      lane.writer->commit(std::span<JournalWrite>(ops.data() + begin, end - begin), results);
      // Callbacks after the commit, on this thread, outside every lock, in
      // queue order: that keeps one id's completions in order.
      // Counted before the callbacks, so a caller that reads the counter
      // after its callback ran sees its own failure in it.
      std::uint64_t failed = 0;
      for (std::size_t i = begin; i < end; ++i)
        if (ops[i].kind == JournalWrite::Kind::append && !results[i - begin].ok()) ++failed;
      if (failed > 0) append_failures_.fetch_add(failed, std::memory_order_relaxed);
      for (std::size_t i = begin; i < end; ++i) {
        auto done = std::move(ops[i].done);
        if (done) done(std::move(results[i - begin]));
      }
      begin = end;
    }
    ops.clear();
  }
}

}  // namespace troupe::detail
