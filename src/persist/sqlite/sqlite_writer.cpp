// The SQLite journal's writer lane: each group commit in one transaction,
// each operation in it under its own savepoint where it may fail alone, and
// the highest seq per id and the fence per key cached so an append reads
// nothing. The rules enforced here are documented in doc/journal.md.

#include "sqlite_writer.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace troupe::sqlite {

Error Writer::fail(std::string_view doing) const { return failed(options_.path, doing, db_.get()); }

Result<void> Writer::open() {
  const std::string& path = options_.path;
  if (auto r = open_for_writing(db_, options_); !r) return r;
  turns_ = write_turns(path);  // the file exists now: found by its canonical path
  if (auto r = ensure_outbox(db_.get(), path); !r) return r;
  if (auto r = prepare_outbox(); !r) return r;
  auto prepared = prepare_all(db_.get(), path,
                     {
                         {&begin_, "BEGIN IMMEDIATE"},         {&commit_, "COMMIT"},
                         {&rollback_, "ROLLBACK"},             {&savepoint_, "SAVEPOINT op"},
                         {&release_, "RELEASE op"},            {&rollback_to_, "ROLLBACK TO op"},
                         {&insert_event_, kInsertEvent},       {&select_highest_, kSelectHighest},
                         {&delete_events_, kDeleteEvents},     {&upsert_deletion_, kUpsertDeletion},
                         {&insert_snapshot_, kInsertSnapshot}, {&prune_snapshots_, kPruneSnapshots},
                         {&select_fence_, kSelectFence},       {&upsert_fence_, kUpsertFence},
                         {&insert_tag_, kInsertTag},           {&select_deleted_tags_, kSelectDeletedTags},
                         {&delete_tag_, kDeleteTag},           {&select_ordering_high_, kSelectOrderingHigh},
                         {&raise_ordering_high_, kRaiseOrderingHigh},
                     });
  if (!prepared) return prepared;
  return load_next_ordering();
}

void Writer::forget() {
  highest_.clear();
  fences_.clear();
}

detail::Committed Writer::commit(std::span<detail::JournalWrite> ops, std::span<Result<void>> results) {
  const std::string& path = options_.path;
  auto fail_all = [&](const Error& e) {
    for (auto& r : results) r = e;
    // The caches may hold numbers from the lost transaction.
    forget();
    if (sqlite3_get_autocommit(db_.get()) == 0) (void)run(db_.get(), path, rollback_.get(), "roll back");
    return detail::Committed{};
  };

  // Until the commit or the rollback (fail_all) is done.
  WriteTurns::Turn turn(turns_.get());
  if (auto r = run(db_.get(), path, begin_.get(), "begin a write transaction"); !r) return fail_all(r.error());

  std::uint64_t written = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    detail::JournalWrite& op = ops[i];
    Result<void> r;
    switch (op.kind) {
      case detail::JournalWrite::Kind::append: r = do_append(op.batch, written); break;
      case detail::JournalWrite::Kind::delete_to: r = do_delete(op.key(), op.value); break;
      case detail::JournalWrite::Kind::snapshot: r = do_snapshot(op.key(), op.snapshot); break;
      case detail::JournalWrite::Kind::fence: r = do_fence(op.key(), op.value); break;
      case detail::JournalWrite::Kind::outbox: r = do_outbox(*op.outbox); break;
    }
    // Some errors (I/O, disk full) make SQLite roll back the whole
    // transaction: then nothing of this chunk is stored, and every op in it
    // must say so, including those that had gone in.
    if (!r.ok() && sqlite3_get_autocommit(db_.get()) != 0)
      return fail_all(Error(ErrorCode::journal_failed,
                            r.error().message() + "; the transaction was rolled back, nothing of it is stored"));
    results[i] = std::move(r);
  }

  if (auto r = run(db_.get(), path, commit_.get(), "commit"); !r) return fail_all(r.error());
  return {1, written};
}

Result<std::uint64_t*> Writer::cached_highest(const std::string& id) {
  if (auto it = highest_.find(id); it != highest_.end()) return &it->second;
  sqlite3_stmt* s = select_highest_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, id) != SQLITE_OK) return fail("bind the persistence id");
  if (sqlite3_step(s) != SQLITE_ROW) return fail("read the highest seq of " + quoted(id));
  // Corrupt (non-integer) values read as 0 here; readers report them.
  auto max_seq = static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 0)));
  auto deleted_to = static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 1)));
  if (highest_.size() >= kMaxCachedIds) highest_.clear();
  return &highest_.emplace(id, std::max(max_seq, deleted_to)).first->second;
}

Result<std::uint64_t*> Writer::cached_fence(const std::string& key) {
  if (auto it = fences_.find(key); it != fences_.end()) return &it->second;
  sqlite3_stmt* s = select_fence_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, key) != SQLITE_OK) return fail("bind the fence key");
  std::uint64_t stored = 0;
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) {
    stored = static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 0)));
  } else if (rc != SQLITE_DONE) {
    return fail("read the fence " + quoted(key));
  }
  if (fences_.size() >= kMaxCachedIds) fences_.clear();
  return &fences_.emplace(key, stored).first->second;
}

Result<void> Writer::do_fence(const std::string& key, std::uint64_t value) {
  if (auto v = validate_fence(key, value); !v) return v;
  auto cached = cached_fence(key);
  if (!cached) return std::move(cached).error();
  std::uint64_t& stored = *cached.value();
  if (stored > value) return fence_lowered(key, value, stored);
  if (stored == value) return {};
  sqlite3_stmt* s = upsert_fence_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, key) != SQLITE_OK || bind_seq(s, 2, value) != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE)
    return fail("raise the fence " + quoted(key) + " to " + std::to_string(value));
  stored = value;
  return {};
}

Result<void> Writer::savepoint() { return run(db_.get(), options_.path, savepoint_.get(), "open a savepoint"); }
Result<void> Writer::release() { return run(db_.get(), options_.path, release_.get(), "release a savepoint"); }
void Writer::rollback_savepoint() {
  // Only this op's rows go; the transaction, and the ops before it, stay.
  if (sqlite3_get_autocommit(db_.get()) != 0) return;
  (void)run(db_.get(), options_.path, rollback_to_.get(), "roll back to a savepoint");
  (void)release();
}

Result<void> Writer::do_append(AppendBatch& batch, std::uint64_t& written) {
  if (auto v = validate_batch(batch); !v.ok()) return v;
  const std::string& id = batch.persistence_id;
  if (batch.events.back().seq > kMaxSeq)
    return Error(ErrorCode::invalid_argument, "append to " + quoted(id) + ": sequence number " +
                                                  std::to_string(batch.events.back().seq) +
                                                  " exceeds the largest storable, " + std::to_string(kMaxSeq));
  if (batch.fence.value != 0) {
    auto fence = cached_fence(batch.fence.key);
    if (!fence) return std::move(fence).error();
    if (*fence.value() > batch.fence.value) return fence_refused(batch, *fence.value());
  }
  auto cached = cached_highest(id);
  if (!cached) return std::move(cached).error();
  std::uint64_t& highest = *cached.value();
  // The cache answers both conflicts without touching the file; the primary
  // key below is the backstop should the cache ever be wrong.
  if (auto c = detail::check_continues(quoted(id), batch.events.front().seq, highest); !c) return c;

  // A one-row INSERT that fails leaves nothing behind (SQLite undoes the
  // statement), so only multi-row batches (several events, tags, or outbox
  // records with the event) need a savepoint.
  bool tagged = false;
  for (const EventRecord& e : batch.events) tagged = tagged || !e.tags.empty();
  const bool multi = batch.events.size() > 1 || !batch.outbox.empty() || tagged;
  if (multi)
    if (auto r = savepoint(); !r) return r;
  sqlite3_stmt* s = insert_event_.get();
  if (bind_text(s, 1, id) != SQLITE_OK) {
    Error e = fail("bind the persistence id");
    if (multi) rollback_savepoint();
    return e;
  }
  for (const EventRecord& e : batch.events) {
    int rc = bind_seq(s, 2, e.seq);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 3, e.timestamp_ms);
    if (rc == SQLITE_OK) rc = bind_text(s, 4, e.type);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 5, e.version);
    if (rc == SQLITE_OK) rc = bind_blob(s, 6, e.payload);
    if (rc == SQLITE_OK) rc = e.trace_id.empty() ? sqlite3_bind_null(s, 7) : bind_text(s, 7, e.trace_id);
    if (rc == SQLITE_OK) {
      if (e.tags.empty()) {
        rc = sqlite3_bind_null(s, 9);
      } else {
        tags_text_ = join_tags(e.tags);
        rc = bind_text(s, 9, tags_text_);
      }
    }
    std::uint64_t ordering = 0;
    int ext = SQLITE_OK;
    auto insert = [&] {
      ordering = next_ordering_++;
      rc = bind_seq(s, 8, ordering);
      if (rc == SQLITE_OK) rc = sqlite3_step(s);
      ext = rc == SQLITE_DONE ? SQLITE_OK : sqlite3_extended_errcode(db_.get());
    };
    if (rc == SQLITE_OK) insert();
    // The ordering is taken by a row this writer did not write (a tool's
    // insert): read the next free number again and try once more.
    if (ext == SQLITE_CONSTRAINT_PRIMARYKEY) {
      sqlite3_reset(s);
      if (load_next_ordering()) insert();
    }
    if (rc != SQLITE_DONE) {
      Error err = fail("append " + quoted(id) + " seq " + std::to_string(e.seq));
      sqlite3_reset(s);
      if (multi) rollback_savepoint();
      if (ext == SQLITE_CONSTRAINT_UNIQUE) {
        highest_.erase(id);  // it was wrong; reload on next use
        return Error(ErrorCode::journal_conflict, quoted(id) + " already holds sequence number " +
                                                      std::to_string(e.seq) + ": another writer appended it");
      }
      return err;
    }
    sqlite3_reset(s);
    if (!e.tags.empty())
      if (auto r = insert_tags(e, ordering); !r) {
        rollback_savepoint();
        return r;
      }
  }
  if (!batch.outbox.empty())
    if (auto r = insert_outbox(batch); !r) {
      rollback_savepoint();
      return r;
    }
  if (multi)
    if (auto r = release(); !r) {
      rollback_savepoint();
      return r;
    }
  highest = batch.events.back().seq;
  written += batch.events.size();
  return {};
}

Result<void> Writer::load_next_ordering() {
  sqlite3_stmt* s = select_ordering_high_.get();
  ResetOnExit reset(s);
  if (sqlite3_step(s) != SQLITE_ROW) return fail("read the highest ordering");
  const auto high = static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 0)));
  next_ordering_ = std::max(next_ordering_, high + 1);
  return {};
}

Result<void> Writer::insert_tags(const EventRecord& e, std::uint64_t ordering) {
  sqlite3_stmt* s = insert_tag_.get();
  for (const std::string& tag : e.tags) {
    ResetOnExit reset(s);
    if (bind_text(s, 1, tag) != SQLITE_OK || bind_seq(s, 2, ordering) != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE)
      return fail("store tag '" + tag + "' of seq " + std::to_string(e.seq));
  }
  return {};
}

Result<void> Writer::delete_tags(const std::string& id, std::uint64_t to_seq) {
  sqlite3_stmt* s = select_deleted_tags_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, id) != SQLITE_OK || bind_seq(s, 2, to_seq) != SQLITE_OK)
    return fail("bind the tags of " + quoted(id));
  sqlite3_stmt* d = delete_tag_.get();
  for (;;) {
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) return {};
    if (rc != SQLITE_ROW) return fail("read the tags of " + quoted(id) + " up to " + std::to_string(to_seq));
    const sqlite3_int64 ordering = sqlite3_column_int64(s, 0);
    const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(s, 1));
    std::string_view tags(text != nullptr ? text : "", static_cast<std::size_t>(sqlite3_column_bytes(s, 1)));
    // Whatever the column holds, every piece of it goes: a garbled value
    // only leaves index entries that match no event.
    for (std::size_t at = 0; at <= tags.size();) {
      std::size_t end = std::min(tags.find(kTagSeparator, at), tags.size());
      ResetOnExit reset_d(d);
      if (sqlite3_bind_text64(d, 1, tags.data() + at, end - at, SQLITE_STATIC, SQLITE_UTF8) != SQLITE_OK ||
          sqlite3_bind_int64(d, 2, ordering) != SQLITE_OK || sqlite3_step(d) != SQLITE_DONE)
        return fail("delete the tags of " + quoted(id) + " up to " + std::to_string(to_seq));
      at = end + 1;
    }
  }
}

Result<void> Writer::keep_ordering_high() {
  if (next_ordering_ <= 1) return {};
  sqlite3_stmt* s = raise_ordering_high_.get();
  ResetOnExit reset(s);
  if (bind_seq(s, 1, next_ordering_ - 1) != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE)
    return fail("keep the highest ordering");
  return {};
}

Result<void> Writer::do_delete(const std::string& id, std::uint64_t to_seq) {
  auto cached = cached_highest(id);
  if (!cached) return std::move(cached).error();
  // Never mark numbers above the highest as deleted: the next append must
  // still be highest + 1.
  const std::uint64_t upto = std::min(to_seq, *cached.value());
  if (upto == 0) return {};
  if (auto r = savepoint(); !r) return r;
  auto step = [&](sqlite3_stmt* s, const char* doing) -> Result<void> {
    ResetOnExit reset(s);
    if (bind_text(s, 1, id) != SQLITE_OK || bind_seq(s, 2, upto) != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE)
      return fail(std::string(doing) + " of " + quoted(id) + " up to " + std::to_string(upto));
    return {};
  };
  // The tags first, while their events still say which they are; and the
  // highest ordering, should this remove the event that holds it.
  Result<void> r = delete_tags(id, upto);
  if (r) r = step(delete_events_.get(), "delete the events");
  if (r) r = step(upsert_deletion_.get(), "record the deletion");
  if (r) r = keep_ordering_high();
  if (r) r = release();
  if (!r) rollback_savepoint();
  return r;
}

Result<void> Writer::do_snapshot(const std::string& id, const SnapshotRecord& snap) {
  if (id.empty()) return Error(ErrorCode::invalid_argument, "snapshot with an empty persistence id");
  if (snap.seq > kMaxSeq)
    return Error(ErrorCode::invalid_argument, "snapshot of " + quoted(id) + " at sequence number " +
                                                  std::to_string(snap.seq) + " exceeds the largest storable");
  if (auto r = savepoint(); !r) return r;
  Result<void> r;
  {
    sqlite3_stmt* s = insert_snapshot_.get();
    ResetOnExit reset(s);
    if (bind_text(s, 1, id) != SQLITE_OK || bind_seq(s, 2, snap.seq) != SQLITE_OK ||
        sqlite3_bind_int64(s, 3, snap.timestamp_ms) != SQLITE_OK || bind_text(s, 4, snap.type) != SQLITE_OK ||
        sqlite3_bind_int64(s, 5, snap.version) != SQLITE_OK || bind_blob(s, 6, snap.payload) != SQLITE_OK ||
        sqlite3_step(s) != SQLITE_DONE)
      r = fail("save a snapshot of " + quoted(id) + " at " + std::to_string(snap.seq));
  }
  if (r) {
    // Only the latest snapshot is ever loaded; older ones are dead weight.
    sqlite3_stmt* s = prune_snapshots_.get();
    ResetOnExit reset(s);
    if (bind_text(s, 1, id) != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE)
      r = fail("drop older snapshots of " + quoted(id));
  }
  if (r) r = release();
  if (!r) rollback_savepoint();
  return r;
}

}  // namespace troupe::sqlite
