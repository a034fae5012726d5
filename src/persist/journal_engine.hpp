#pragma once
// The threading skeleton shared by the SQLite and PostgreSQL journals:
// group commit on writer lanes, and a pool of reader threads.
//
// GroupCommit: each lane is one writer thread with its own queue and its own
// connection (a JournalLane the back end supplies). An operation goes to the
// lane its key hashes to (the persistence id; a fence's key), so every
// operation on one id runs on one lane, in the order it was made. A lane
// takes everything queued (up to max_weight events per transaction; one
// larger batch still goes whole) and hands it to its JournalLane::commit as
// one transaction, then runs the callbacks in queue order, outside every
// lock. With one lane (SQLite's single writer) this is classic group commit;
// with several (PostgreSQL) the transactions of different lanes overlap, so
// the server's own group commit of WAL flushes has concurrency to work with.
//
// ReaderPool: `n` threads, each with its own reader object (connection and
// statements), taking read tasks from one queue.
//
// Both keep themselves alive through the `keep_alive` handle their threads
// hold, so a journal may be destroyed from one of its own callbacks: close()
// then detaches the calling thread, which finishes its queue and frees the
// state when it exits.
//
// Internal to the persist layer. Thread-safe as described per member.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "troupe/persist/journal.hpp"

namespace troupe::detail {

// One write operation.
struct JournalWrite {
  enum class Kind : std::uint8_t { append, delete_to, snapshot, fence };
  Kind kind = Kind::append;
  AppendBatch batch;         // append: the batch; delete/snapshot: persistence_id; fence: its key
  std::uint64_t value = 0;   // delete_to: the last seq to delete; fence: the value to raise to
  SnapshotRecord snapshot;   // snapshot
  Journal::Callback<void> done;

  std::size_t weight() const { return kind == Kind::append ? batch.events.size() : 1; }
  const std::string& key() const { return batch.persistence_id; }
};

// A back end's writer: one per lane, used by that lane's thread only.
class JournalLane {
 public:
  virtual ~JournalLane() = default;
  // Stores `ops` in one transaction (as far as the back end can) and sets
  // results[i] for ops[i] (results has ops.size() entries, all success on
  // entry).
  virtual void commit(std::span<JournalWrite> ops, std::span<Result<void>> results) = 0;
};

class GroupCommit {
 public:
  GroupCommit(std::vector<std::unique_ptr<JournalLane>> lanes, std::size_t max_weight,
              std::function<Error()> closed_error);
  ~GroupCommit();
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  // Starts one thread per lane; each holds `keep_alive` until it exits.
  void start(std::shared_ptr<void> keep_alive);
  // Queues `op` on its lane, or answers it with closed_error() once closed.
  void submit(JournalWrite&& op);
  // Stops taking operations; lanes finish what is queued.
  void close();
  // Waits for the lane threads to finish (detaching the caller's own, if it
  // is one). Close both engines of a journal before joining either, so a
  // callback run while one drains finds the other closed as well.
  void join();

  // Appends answered with an error (monotonic).
  std::uint64_t append_failures() const noexcept { return append_failures_.load(std::memory_order_relaxed); }
  // The lane an operation on `key` runs on.
  std::size_t lane_of(const std::string& key) const noexcept;

 private:
  struct Lane {
    std::unique_ptr<JournalLane> writer;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<JournalWrite> queue;  // guarded by mu
    bool idle = false;                // guarded by mu: the thread waits on cv
    bool closed = false;              // guarded by mu
    std::thread thread;
  };
  void run(Lane& lane);

  std::vector<std::unique_ptr<Lane>> lanes_;
  const std::size_t max_weight_;
  const std::function<Error()> closed_error_;
  std::atomic<std::uint64_t> append_failures_{0};
};

template <class Reader>
class ReaderPool {
 public:
  using Task = std::function<void(Reader*)>;  // nullptr: the journal is closed

  explicit ReaderPool(std::vector<std::unique_ptr<Reader>> readers) : readers_(std::move(readers)) {}
  ~ReaderPool() {
    close();
    join();
  }
  ReaderPool(const ReaderPool&) = delete;
  ReaderPool& operator=(const ReaderPool&) = delete;

  void start(const std::shared_ptr<void>& keep_alive) {
    for (auto& r : readers_)
      threads_.emplace_back([this, keep_alive, reader = r.get()] { loop(*reader); });
  }

  // Runs `task` on a reader thread, or task(nullptr) here once closed.
  void submit(Task&& task) {
    {
      std::lock_guard lk(mu_);
      if (!closed_) {
        queue_.push_back(std::move(task));
        task = nullptr;
      }
    }
    if (task) return task(nullptr);
    cv_.notify_one();
  }

  void close() {
    {
      std::lock_guard lk(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

  void join() {
    const auto me = std::this_thread::get_id();
    for (auto& t : threads_) {
      if (t.get_id() == me)
        t.detach();
      else if (t.joinable())
        t.join();
    }
  }

 private:
  void loop(Reader& reader) {
    for (;;) {
      Task task;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return !queue_.empty() || closed_; });
        if (queue_.empty()) return;  // closed and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task(&reader);
    }
  }

  std::vector<std::unique_ptr<Reader>> readers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // guarded by mu_
  bool closed_ = false;     // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace troupe::detail
