#pragma once
// The group-commit engine shared by the SQLite and PostgreSQL journals: the
// threads, queues, batching and result delivery; a back end supplies only
// its writer lanes and its readers (its SQL).
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
// JournalEngine: both of them behind the Journal operations, as
// detail::GroupCommitJournal (the public base of both journals) calls them.
//
// Every thread keeps the back end's state alive through the `keep_alive`
// handle it holds, so a journal may be destroyed from one of its own
// callbacks: shutdown() then detaches the calling thread, which finishes its
// queue and frees the state when it exits.
//
// Internal to the persist layer. Thread-safe as described per member.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "append_listeners.hpp"
#include "troupe/persist/journal.hpp"

namespace troupe::detail {

// An outbox claim or settlement (outbox.hpp) for a writer lane, which
// stores the records it claimed in `claimed`.
struct OutboxWrite {
  std::optional<OutboxClaim> claim;
  std::optional<OutboxSettlement> settlement;
  std::vector<OutboxEntry> claimed;
};

// One write operation.
struct JournalWrite {
  enum class Kind : std::uint8_t { append, delete_to, snapshot, fence, outbox };
  Kind kind = Kind::append;
  AppendBatch batch;         // append: the batch; delete/snapshot: persistence_id; fence: its key
  std::uint64_t value = 0;   // delete_to: the last seq to delete; fence: the value to raise to
  SnapshotRecord snapshot;   // snapshot
  Journal::Callback<void> done;
  std::shared_ptr<OutboxWrite> outbox{};  // outbox

  std::size_t weight() const { return kind == Kind::append ? batch.events.size() : 1; }
  const std::string& key() const { return batch.persistence_id; }
};

// What one JournalLane::commit stored.
struct Committed {
  std::uint64_t transactions = 0;  // write transactions committed
  std::uint64_t events = 0;        // events they stored
};

// A back end's writer: one per lane, used by that lane's thread only.
class JournalLane {
 public:
  virtual ~JournalLane() = default;
  // Stores `ops` in one transaction (as far as the back end can) and sets
  // results[i] for ops[i] (results has ops.size() entries, all success on
  // entry). Returns what it committed.
  virtual Committed commit(std::span<JournalWrite> ops, std::span<Result<void>> results) = 0;
};

// A back end's reader: one connection and its statements, used by one
// reader thread at a time. Each call is one consistent read.
class JournalReader {
 public:
  virtual ~JournalReader() = default;
  virtual Result<std::vector<EventRecord>> replay(const std::string& id, std::uint64_t from, std::uint64_t to) = 0;
  virtual Result<std::uint64_t> highest_seq(const std::string& id) = 0;
  virtual Result<std::optional<SnapshotRecord>> load_snapshot(const std::string& id) = 0;
  virtual Result<Recovery> recover(const std::string& id) = 0;
  // The recoveries of `ids`, in order. The default recovers one by one; a
  // back end that answers several in one round trip overrides it.
  virtual std::vector<Result<Recovery>> recover_many(const std::vector<std::string>& ids);
  virtual Result<std::uint64_t> highest_fence() = 0;
  // The outbox's counts and entries (outbox.hpp).
  virtual Result<OutboxView> read_outbox(const OutboxQuery& query) = 0;
  // A page of the global order (event_query.hpp); `query` is valid. The
  // default answers invalid_argument: a back end without queries.
  virtual Result<EventPage> query_events(const EventQuery& query);
};

// The highest sequence number of an id, as stored: the largest stored seq
// and the deletion mark (deleted numbers are never reused).
struct StoredHighest {
  std::uint64_t max_seq = 0;
  std::uint64_t deleted_to = 0;
  std::uint64_t value() const { return std::max(max_seq, deleted_to); }
};

// journal_conflict unless an append starting at `first` continues
// `highest`: a number already stored, or a gap after it. `shown_id` is the
// id as the back end prints it in messages.
Result<void> check_continues(const std::string& shown_id, std::uint64_t first, std::uint64_t highest);

class GroupCommit {
 public:
  // `appended` (may be null; outlives this) is notified after every
  // transaction that stored events, before its callbacks run.
  GroupCommit(std::vector<std::unique_ptr<JournalLane>> lanes, std::size_t max_weight,
              std::function<Error()> closed_error, AppendListeners* appended = nullptr);
  ~GroupCommit();
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  // Starts one thread per lane; each holds `keep_alive` until it exits.
  void start(const std::shared_ptr<void>& keep_alive);
  // Queues `op` on its lane, or answers it with closed_error() once closed.
  void submit(JournalWrite&& op);
  // Stops taking operations; lanes finish what is queued.
  void close();
  // Waits for the lane threads to finish (detaching the caller's own, if it
  // is one). Close both engines of a journal before joining either, so a
  // callback run while one drains finds the other closed as well.
  void join();

  // Counters (monotonic; relaxed reads). Each is counted before the
  // callbacks of what it counts run, so a caller that reads one after its
  // callback ran sees its own operation in it.
  std::uint64_t append_failures() const noexcept { return append_failures_.load(std::memory_order_relaxed); }
  std::uint64_t transactions() const noexcept { return transactions_.load(std::memory_order_relaxed); }
  std::uint64_t events_written() const noexcept { return events_written_.load(std::memory_order_relaxed); }
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
  AppendListeners* const appended_;
  std::atomic<std::uint64_t> append_failures_{0};
  std::atomic<std::uint64_t> transactions_{0};
  std::atomic<std::uint64_t> events_written_{0};
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

  std::size_t size() const noexcept { return readers_.size(); }

  void start(const std::shared_ptr<void>& keep_alive) {
    for (auto& r : readers_)
      threads_.emplace_back([this, keep_alive, reader = r.get()] { loop(*reader); });
  }

  // Runs `task` on a reader thread, or task(nullptr) here once closed.
  // `first`: ahead of what waits (a short read that must not queue behind
  // a burst of others, such as a projection's page behind recoveries).
  void submit(Task&& task, bool first = false) {
    {
      std::lock_guard lk(mu_);
      if (!closed_) {
        if (first)
          queue_.push_front(std::move(task));
        else
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

// The Journal operations over one GroupCommit and one ReaderPool. A back end
// keeps it as a member of its shared state, builds its lanes and readers in
// open(), and hands it to GroupCommitJournal. Thread-safe once open.
class JournalEngine {
 public:
  struct Options {
    std::size_t max_batch_events = 1;  // per transaction and lane
    // Recoveries a reader answers in one go (JournalReader::recover_many)
    // when they wait for a busy reader; 1: each is a read of its own.
    std::size_t recover_batch = 1;
    std::function<Error()> closed_error;  // what operations get once the journal is closed
    // The readers answer query_events (JournalReader::query_events).
    bool queries = false;
  };

  explicit JournalEngine(Options options) : options_(std::move(options)) {}
  ~JournalEngine();
  JournalEngine(const JournalEngine&) = delete;
  JournalEngine& operator=(const JournalEngine&) = delete;

  // Takes the lanes and readers, open and ready; once.
  void open(std::vector<std::unique_ptr<JournalLane>> lanes, std::vector<std::unique_ptr<JournalReader>> readers);
  // Starts every thread; each holds `keep_alive` (the back end's state).
  void start(const std::shared_ptr<void>& keep_alive);
  // Commits what is queued, runs every callback, fails later operations
  // with closed_error and joins the threads (detaching the caller's own).
  void shutdown();

  void append(AppendBatch batch, Journal::Callback<void> done) {
    writes_->submit({JournalWrite::Kind::append, std::move(batch), 0, {}, std::move(done)});
  }
  void delete_up_to(std::string id, std::uint64_t to_seq, Journal::Callback<void> done);
  void save_snapshot(std::string id, SnapshotRecord snapshot, Journal::Callback<void> done);
  void raise_fence(std::string key, std::uint64_t value, Journal::Callback<void> done);
  void claim_outbox(OutboxClaim claim, Journal::Callback<std::vector<OutboxEntry>> done);
  void settle_outbox(OutboxSettlement settlement, Journal::Callback<void> done);

  void replay(std::string id, std::uint64_t from, std::uint64_t to, Journal::Callback<std::vector<EventRecord>> done);
  void highest_seq(std::string id, Journal::Callback<std::uint64_t> done);
  void load_snapshot(std::string id, Journal::Callback<std::optional<SnapshotRecord>> done);
  void recover(std::string id, Journal::Callback<Recovery> done);
  void highest_fence(Journal::Callback<std::uint64_t> done);
  void read_outbox(OutboxQuery query, Journal::Callback<OutboxView> done);
  bool supports_queries() const noexcept { return options_.queries; }
  // Validates `query`, then runs it on a reader.
  void query_events(EventQuery query, Journal::Callback<EventPage> done);
  // The listeners (event_query.hpp "Live"): local commits notify them; a
  // back end that hears of other processes' commits calls notify_appended.
  std::uint64_t add_append_listener(std::function<void()> f) { return listeners_.add(std::move(f)); }
  void remove_append_listener(std::uint64_t id) { listeners_.remove(id); }
  void notify_appended() { listeners_.notify(); }

  // Counters (monotonic): see GroupCommit.
  std::uint64_t transactions() const noexcept { return writes_->transactions(); }
  std::uint64_t events_written() const noexcept { return writes_->events_written(); }
  std::uint64_t append_failures() const noexcept { return writes_->append_failures(); }
  JournalStats stats() const { return {transactions(), events_written()}; }
  // The lane an operation on `key` runs on (the index into open()'s lanes).
  std::size_t lane_of(const std::string& key) const noexcept { return writes_->lane_of(key); }

 private:
  struct PendingRecovery {
    std::string id;
    Journal::Callback<Recovery> done;
  };
  // Runs `fn(reader)` on a reader thread and answers `done` with its
  // result, or with closed_error once closed; `first` as ReaderPool::submit.
  template <class T, class Fn>
  void read(Journal::Callback<T> done, Fn fn, bool first = false);
  void recover_waiting(JournalReader* r);

  const Options options_;
  AppendListeners listeners_;  // declared before the lanes, which notify it
  std::unique_ptr<GroupCommit> writes_;
  std::unique_ptr<ReaderPool<JournalReader>> reads_;
  std::mutex recover_mu_;
  std::deque<PendingRecovery> recoveries_;  // guarded by recover_mu_
  std::size_t recover_tasks_ = 0;  // guarded by recover_mu_: reader tasks queued or running for recoveries_
};

}  // namespace troupe::detail
