// The PostgreSQL journal's writer lane: its connection, what it knows of
// each id's highest seq, and the group path; the slow path and fences are in
// postgres_slow_path.cpp. Three paths, from common to rare:
//  - the group: everything on the lane that continues what the lane knows
//    goes to the server as one pipeline of prepared statements (fence check,
//    one multi-row INSERT of all appended events, snapshots, deletions) and
//    one Sync: one implicit transaction, one round trip, no SAVEPOINT and
//    no read of the highest seq;
//  - the slow path: when the group is refused (a primary-key conflict, a
//    fence) or an append does not continue what the lane knows, those
//    operations run again in one explicit transaction, each under its own
//    SAVEPOINT after a fresh read, so each gets its own outcome;
//  - fences: each raise in a transaction of its own, after the rest.

#include "postgres_writer.hpp"

#include "pg_announce.hpp"
#include "pg_outbox.hpp"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <utility>

namespace troupe::pg {

using detail::JournalWrite;
using Kind = detail::JournalWrite::Kind;

namespace {

Result<void> validate_append(const AppendBatch& batch) {
  if (auto v = validate_batch(batch); !v) return v;
  if (batch.events.back().seq > kMaxSeq)
    return Error(ErrorCode::invalid_argument, "append to " + printable(batch.persistence_id) +
                                                  ": sequence number exceeds the largest storable, " +
                                                  std::to_string(kMaxSeq));
  return {};
}

}  // namespace

Error conflict(const AppendBatch& b) {
  return Error(ErrorCode::journal_conflict, printable(b.persistence_id) + " already holds one of sequence numbers " +
                                                std::to_string(b.events.front().seq) + ".." +
                                                std::to_string(b.events.back().seq) + ": another writer appended it");
}

std::uint64_t refused_at(const Outcome& o) {
  auto space = o.detail.find(' ');
  if (space == std::string::npos) return 0;
  return std::strtoull(o.detail.c_str() + space + 1, nullptr, 10);
}

std::optional<Params> fence_check(const std::string& schema, const std::vector<const AppendBatch*>& batches) {
  std::set<std::pair<std::string, std::uint64_t>> pairs;
  std::set<std::int64_t> locks;
  for (const AppendBatch* b : batches) {
    if (b->fence.value == 0) continue;
    if (pairs.emplace(b->fence.key, b->fence.value).second) locks.insert(fence_lock(schema, b->fence.key));
  }
  if (pairs.empty()) return std::nullopt;
  ArrayParam keys(kByteaOid), values(kInt8Oid), lock_keys(kInt8Oid);
  keys.start(pairs.size());
  values.start(pairs.size());
  for (const auto& [k, v] : pairs) {
    keys.bytes(k);
    values.int8(static_cast<std::int64_t>(v));
  }
  lock_keys.start(locks.size());
  for (std::int64_t l : locks) lock_keys.int8(l);
  Params p;
  p.array(keys.take(), keys.array_type());
  p.array(values.take(), values.array_type());
  p.array(lock_keys.take(), lock_keys.array_type());
  return p;
}

Params append_rows(const std::vector<const AppendBatch*>& batches) {
  std::size_t n = 0;
  for (const AppendBatch* b : batches) n += b->events.size();
  RowArrays rows;
  ArrayParam traces(kByteaOid);
  rows.start(n);
  traces.start(n);
  for (const AppendBatch* b : batches)
    for (const EventRecord& e : b->events) {
      rows.add(b->persistence_id, e);
      traces.bytes(e.trace_id);
    }
  Params p = rows.params();
  p.array(traces.take(), traces.array_type());
  return p;
}

Call append_call(const std::vector<const AppendBatch*>& batches) {
  std::size_t events = 0, tagged = 0;
  for (const AppendBatch* b : batches)
    for (const EventRecord& e : b->events) {
      ++events;
      tagged += e.tags.size();
    }
  if (tagged == 0) return {Sql::kAppend, append_rows(batches)};
  Params p = append_rows(batches);
  ArrayParam joined(kByteaOid), index(kInt8Oid), tags(kByteaOid);
  joined.start(events);
  index.start(tagged);
  tags.start(tagged);
  std::int64_t n = 0;
  for (const AppendBatch* b : batches)
    for (const EventRecord& e : b->events) {
      ++n;
      joined.bytes(join_tags(e.tags));
      for (const std::string& t : e.tags) {
        index.int8(n);
        tags.bytes(t);
      }
    }
  for (ArrayParam* a : {&joined, &index, &tags}) p.array(a->take(), a->array_type());
  return {Sql::kAppendTagged, std::move(p)};
}

Result<PgConn> Shared::connect(const std::vector<Sql::Prepared>& statements) const {
  PgConn c(PQconnectdb(options.conninfo.c_str()));
  if (!c) return Error(ErrorCode::journal_failed, "postgres journal: cannot connect: out of memory");
  if (PQstatus(c.get()) != CONNECTION_OK)
    return Error(ErrorCode::journal_failed, "postgres journal: cannot connect: " + trim(PQerrorMessage(c.get())));
  // Quiet NOTICEs ("schema already exists") instead of printing them to stderr.
  PQsetNoticeProcessor(c.get(), [](void*, const char*) {}, nullptr);
  if (!statements.empty())
    if (auto r = prepare_all(c.get(), statements); !r) return std::move(r).error();
  return c;
}

Result<void> Writer::connect_now() {
  auto c = shared_.connect(shared_.sql.writer_statements());
  if (!c) return std::move(c).error();
  conn_ = std::move(*c);
  connected_once_ = true;
  return {};
}

bool Writer::ensure_connected(Clock::time_point deadline, std::string& why) {
  for (;;) {
    if (conn_ && PQstatus(conn_.get()) == CONNECTION_OK) return true;
    conn_.reset();
    if (Clock::now() >= next_attempt_) {
      auto c = shared_.connect(shared_.sql.writer_statements());
      if (c) {
        conn_ = std::move(*c);
        backoff_ms_ = 0;
        if (connected_once_) shared_.reconnects.fetch_add(1, std::memory_order_relaxed);
        connected_once_ = true;
        return true;
      }
      last_connect_error_ = c.error().message();
      backoff_ms_ = backoff_ms_ == 0 ? shared_.options.reconnect_initial_ms
                                     : std::min(backoff_ms_ * 2, shared_.options.reconnect_max_ms);
      next_attempt_ = Clock::now() + std::chrono::milliseconds(backoff_ms_);
    }
    if (Clock::now() >= deadline) {
      why = last_connect_error_;
      return false;
    }
    std::this_thread::sleep_until(std::min(next_attempt_, deadline));
  }
}

void Writer::hint(const std::string& id, std::uint64_t highest) {
  std::lock_guard lk(hints_mu_);
  if (hints_.size() >= kMaxCachedHighest) return;  // the lane reads what it was not told
  auto& h = hints_[id];
  h = std::max(h, highest);
}

void Writer::take_hints() {
  std::unordered_map<std::string, std::uint64_t> hints;
  {
    std::lock_guard lk(hints_mu_);
    if (hints_.empty()) return;
    hints.swap(hints_);
  }
  if (highest_.size() + hints.size() > kMaxCachedHighest) highest_.clear();
  for (auto& [id, h] : hints) {
    auto& mine = highest_[id];
    mine = std::max(mine, h);
  }
}

Result<std::vector<detail::StoredHighest>> Writer::read_highest(const std::vector<std::string>& ids, bool& lost) {
  ArrayParam a(kByteaOid);
  a.start(ids.size());
  for (const auto& id : ids) a.bytes(id);
  Params p;
  p.array(a.take(), a.array_type());
  Outcome o = run_prepared(conn_.get(), Sql::kHighestMany, p);
  if (!o.ok) {
    lost = o.lost;
    return failed("read the highest seq of " + std::to_string(ids.size()) + " ids", o);
  }
  const PGresult* r = o.res.get();
  if (PQntuples(r) != static_cast<int>(ids.size()))
    return Error(ErrorCode::journal_failed, "postgres journal: read the highest seq: " +
                                                std::to_string(PQntuples(r)) + " rows for " +
                                                std::to_string(ids.size()) + " ids");
  std::vector<detail::StoredHighest> out(ids.size());
  for (int row = 0; row < PQntuples(r); ++row) {
    std::uint64_t* values[] = {&out[static_cast<std::size_t>(row)].max_seq,
                               &out[static_cast<std::size_t>(row)].deleted_to};
    const char* names[] = {"max(seq) of its events", "its deleted_to mark"};
    for (int col = 0; col < 2; ++col) {
      if (PQgetisnull(r, row, col) != 0) continue;
      std::int64_t v = read_int8(PQgetvalue(r, row, col));
      if (v < 0)
        return Error(ErrorCode::corrupt_record, "postgres journal: corrupt record of persistence id " +
                                                    printable(ids[static_cast<std::size_t>(row)]) + " seq ?: " +
                                                    names[col] + " is " + std::to_string(v) +
                                                    ", expected a non-negative bigint");
      *values[col] = static_cast<std::uint64_t>(v);
    }
  }
  return out;
}

detail::Committed Writer::commit(std::span<JournalWrite> ops, std::span<Result<void>> results) {
  committed_ = {};
  const auto deadline = Clock::now() + std::chrono::milliseconds(shared_.options.unavailable_timeout_ms);
  take_hints();
  enum class Route : std::uint8_t { done, group, slow, fence, outbox };
  std::vector<Route> route(ops.size(), Route::done);

  // Validate; note the appended ids this lane knows nothing about.
  std::vector<std::string> unknown;
  std::unordered_set<std::string_view> unknown_set;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    JournalWrite& op = ops[i];
    Result<void> v;
    switch (op.kind) {
      case Kind::append:
        if (op.batch.fence.value == 0 && shared_.owner.value != 0) op.batch.fence = shared_.owner;
        v = validate_append(op.batch);
        if (v && !highest_.contains(op.key()) && unknown_set.insert(op.key()).second) unknown.push_back(op.key());
        break;
      case Kind::snapshot:
        if (op.key().empty())
          v = Error(ErrorCode::invalid_argument, "snapshot with an empty persistence id");
        else if (op.snapshot.seq > kMaxSeq)
          v = Error(ErrorCode::invalid_argument, "snapshot sequence number exceeds the largest storable");
        break;
      case Kind::delete_to: break;
      case Kind::fence: v = validate_fence(op.key(), op.value); break;
      case Kind::outbox: break;
    }
    if (!v) {
      results[i] = std::move(v);
    } else {
      route[i] = op.kind == Kind::fence ? Route::fence : op.kind == Kind::outbox ? Route::outbox : Route::group;
    }
  }
  if (!unknown.empty()) {
    Result<std::vector<detail::StoredHighest>> read = Error(ErrorCode::journal_failed, "not read");
    std::string why;
    for (;;) {
      if (!ensure_connected(deadline, why)) {
        read = Error(ErrorCode::journal_failed, "postgres journal: the server is unreachable: " + why +
                                                    "; nothing of it was stored");
        break;
      }
      bool lost = false;
      read = read_highest(unknown, lost);
      if (!lost || Clock::now() >= deadline) break;
      drop_connection();
    }
    if (read) {
      if (highest_.size() + unknown.size() > kMaxCachedHighest) highest_.clear();
      for (std::size_t k = 0; k < unknown.size(); ++k) highest_[unknown[k]] = (*read)[k].value();
    } else {
      for (std::size_t i = 0; i < ops.size(); ++i)
        if (route[i] == Route::group && ops[i].kind == Kind::append && unknown_set.contains(ops[i].key())) {
          results[i] = read.error();
          route[i] = Route::done;
        }
    }
  }

  // In order: what continues the lane's knowledge joins the group; what
  // does not goes to the slow path, and so does everything after it on
  // the same id (one id's operations stay in order).
  std::unordered_set<std::string_view> slow_ids;
  std::vector<std::size_t> group, slow;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (route[i] != Route::group) continue;
    JournalWrite& op = ops[i];
    if (slow_ids.contains(op.key())) {
      route[i] = Route::slow;
    } else if (op.kind == Kind::append) {
      auto it = highest_.find(op.key());
      const std::uint64_t first = op.batch.events.front().seq;
      if (it != highest_.end() && first == it->second + 1) {
        it->second = op.batch.events.back().seq;  // as the group will leave it
      } else if (it != highest_.end() && first <= it->second) {
        results[i] = conflict(op.batch);  // the lane's number is never above the stored one
        route[i] = Route::done;
      } else {
        route[i] = Route::slow;  // a gap, or the lane is behind: decide on a fresh read
        slow_ids.insert(op.key());
      }
    }
    if (route[i] == Route::group) group.push_back(i);
    if (route[i] == Route::slow) slow.push_back(i);
  }

  if (!group.empty()) {
    Error error;
    switch (commit_group(ops, group, deadline, error)) {
      case GroupEnd::committed: break;
      case GroupEnd::rolled_back:
        // Refused as a whole: each operation again on its own.
        forget();
        slow.insert(slow.end(), group.begin(), group.end());
        std::sort(slow.begin(), slow.end());
        break;
      case GroupEnd::failed:
        forget();
        for (std::size_t i : group) results[i] = error;
        break;
    }
  }
  if (!slow.empty()) commit_slow(ops, slow, results, deadline);
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (route[i] == Route::outbox) results[i] = do_outbox(*ops[i].outbox, deadline);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (route[i] != Route::fence) continue;
    auto r = raise(ops[i].key(), ops[i].value, false, deadline);
    if (!r)
      results[i] = std::move(r).error();
    else if (*r > ops[i].value)
      results[i] = fence_lowered(ops[i].key(), ops[i].value, *r);
  }
  // Other processes' journals hear of it; this one's listeners are called
  // by the engine. Only this process's own commits: announcing what the
  // announcer heard would echo between journals for ever.
  if (committed_.events > 0 && shared_.announcer != nullptr) shared_.announcer->announce();
  return committed_;
}

Writer::GroupEnd Writer::commit_group(std::span<JournalWrite> ops, const std::vector<std::size_t>& group,
                                      Clock::time_point deadline, Error& error) {
  std::vector<const AppendBatch*> appends;
  std::vector<std::size_t> snapshots;
  std::vector<Call> calls;
  std::uint64_t events = 0;
  for (std::size_t i : group) {
    if (ops[i].kind == Kind::append) {
      appends.push_back(&ops[i].batch);
      events += ops[i].batch.events.size();
    } else if (ops[i].kind == Kind::snapshot) {
      snapshots.push_back(i);
    }
  }
  if (auto f = fence_check(shared_.options.schema, appends)) calls.push_back({Sql::kCheckFences, std::move(*f)});
  if (!appends.empty()) calls.push_back(append_call(appends));
  if (auto o = outbox_rows(appends)) calls.push_back({Sql::kOutboxAppend, std::move(*o)});
  if (!snapshots.empty()) {
    RowArrays rows;
    rows.start(snapshots.size());
    ArrayParam ids(kByteaOid);
    ids.start(snapshots.size());
    for (std::size_t i : snapshots) {
      rows.add(ops[i].key(), ops[i].snapshot);
      ids.bytes(ops[i].key());
    }
    calls.push_back({Sql::kInsertSnapshots, rows.params()});
    Params prune;
    prune.array(ids.take(), ids.array_type());
    calls.push_back({Sql::kPruneSnapshots, std::move(prune)});
  }
  for (std::size_t i : group) {
    if (ops[i].kind != Kind::delete_to) continue;
    Params p;
    p.bytes(ops[i].key());
    p.int8(static_cast<std::int64_t>(std::min(ops[i].value, kMaxSeq)));
    calls.push_back({Sql::kDeleteTo, std::move(p)});
  }
  for (;;) {
    std::string why;
    if (!ensure_connected(deadline, why)) {
      error = Error(ErrorCode::journal_failed,
                    "postgres journal: the server is unreachable: " + why + "; nothing of it was stored");
      return GroupEnd::failed;
    }
    Outcome o = run_pipeline(conn_.get(), calls);
    if (o.ok) {
      count_commit(events);
      return GroupEnd::committed;
    }
    if (!o.lost) return GroupEnd::rolled_back;
    // The connection broke with the transaction sent: it committed or not.
    // One of its rows says which, once a connection is back.
    drop_connection();
    std::string reconnect_why;
    std::optional<bool> stored =
        appends.empty() ? std::nullopt : verify(*appends.front(), deadline, reconnect_why);
    if (stored == true) {
      count_commit(events);
      return GroupEnd::committed;
    }
    if (stored == false && Clock::now() < deadline) continue;  // nothing stored: send it again
    error = Error(ErrorCode::journal_failed,
                  stored == false ? "postgres journal: the connection was lost and the server stayed unreachable: " +
                                        o.message + "; nothing of it was stored"
                                  : "postgres journal: the connection was lost during the commit; the outcome is "
                                    "unknown (the write may or may not be stored): " + o.message +
                                        (reconnect_why.empty() ? "" : "; reconnecting failed: " + reconnect_why));
    return GroupEnd::failed;
  }
}

std::optional<bool> Writer::verify(const AppendBatch& batch, Clock::time_point deadline, std::string& why) {
  for (;;) {
    if (!ensure_connected(deadline, why)) return std::nullopt;
    const EventRecord& e = batch.events.front();
    Params p;
    p.bytes(batch.persistence_id);
    p.int8(static_cast<std::int64_t>(e.seq));
    p.int8(e.timestamp_ms);
    p.bytes(e.payload);
    Outcome o = run_prepared(conn_.get(), Sql::kVerify, p);
    if (o.ok) return PQntuples(o.res.get()) > 0;
    if (!o.lost || Clock::now() >= deadline) return std::nullopt;
    drop_connection();
  }
}

}  // namespace troupe::pg
