// The PostgreSQL journal's writer lane, its rare paths (postgres_writer.cpp
// has the group path): operations the group could not take, each under its
// own SAVEPOINT in one explicit transaction after a fresh read, so each gets
// its own outcome; fence raises, and outbox claims and settlements
// (pg_outbox.cpp has their SQL), each in a transaction of its own.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "pg_outbox.hpp"
#include "postgres_writer.hpp"

namespace troupe::pg {

using detail::JournalWrite;
using Kind = detail::JournalWrite::Kind;

void Writer::commit_slow(std::span<JournalWrite> ops, const std::vector<std::size_t>& slow,
                         std::span<Result<void>> results, Clock::time_point deadline) {
  auto fail_all = [&](const std::string& why) {
    forget();
    for (std::size_t i : slow)
      results[i] = Error(ErrorCode::journal_failed, "postgres journal: " + why + "; nothing of it was stored");
  };
  // A transaction lost before COMMIT stored nothing and is repeated on a new
  // connection while the deadline allows; one lost during COMMIT is not.
  for (;;) {
    std::string why;
    if (!ensure_connected(deadline, why)) return fail_all("the server is unreachable: " + why);
    PGconn* c = conn_.get();
    Outcome b = run(c, "BEGIN");
    if (!b.ok) {
      if (b.lost && Clock::now() < deadline) continue;
      return fail_all("begin a transaction: " + b.message);
    }
    std::uint64_t written = 0;
    bool lost = false;
    std::string lost_why;
    for (std::size_t i : slow) {
      Result<void> r = apply_one(ops[i], written, lost);
      if (lost) {
        lost_why = r.ok() ? "the transaction was lost" : r.error().message();
        break;
      }
      results[i] = std::move(r);
    }
    if (lost) {
      forget();
      if (PQstatus(c) == CONNECTION_OK) (void)run(c, "ROLLBACK");
      if (PQstatus(c) != CONNECTION_OK && Clock::now() < deadline) continue;
      return fail_all(lost_why);
    }
    Outcome cm = run(c, "COMMIT");
    if (cm.ok && cm.res && std::strcmp(PQcmdStatus(cm.res.get()), "ROLLBACK") == 0) {
      cm.ok = false;
      cm.message = "the server rolled the transaction back";
    }
    if (!cm.ok) {
      forget();
      for (std::size_t i : slow) {
        if (!results[i].ok()) continue;  // its own failure stands: it was rolled back to its savepoint anyway
        results[i] = Error(ErrorCode::journal_failed,
                           cm.lost ? "postgres journal: the connection was lost during COMMIT; the outcome is "
                                     "unknown (the write may or may not be stored): " + cm.message
                                   : "postgres journal: COMMIT failed, nothing was stored: " + cm.message);
      }
      return;
    }
    count_commit(written);
    for (std::size_t i : slow) {
      if (ops[i].kind != Kind::append) continue;
      if (results[i].ok())
        highest_[ops[i].key()] = ops[i].batch.events.back().seq;
      else
        highest_.erase(ops[i].key());
    }
    return;
  }
}

Result<void> Writer::apply_one(JournalWrite& op, std::uint64_t& written, bool& lost) {
  PGconn* c = conn_.get();
  Outcome sp = run(c, "SAVEPOINT op");
  if (!sp.ok) {
    lost = true;
    return failed("savepoint", sp);
  }
  Result<void> r;
  switch (op.kind) {
    case Kind::append:
      r = slow_append(op.batch, lost);
      if (r) written += op.batch.events.size();
      break;
    case Kind::delete_to: {
      Params p;
      p.bytes(op.key());
      p.int8(static_cast<std::int64_t>(std::min(op.value, kMaxSeq)));
      Outcome o = run_prepared(c, Sql::kDeleteTo, p);
      if (!o.ok) {
        lost = o.lost;
        r = failed("delete the events of " + printable(op.key()) + " up to " + std::to_string(op.value), o);
      }
      break;
    }
    case Kind::snapshot: {
      RowArrays rows;
      rows.start(1);
      rows.add(op.key(), op.snapshot);
      Outcome o = run_prepared(c, Sql::kInsertSnapshots, rows.params());
      if (o.ok) {
        ArrayParam ids(kByteaOid);
        ids.start(1);
        ids.bytes(op.key());
        Params p;
        p.array(ids.take(), ids.array_type());
        o = run_prepared(c, Sql::kPruneSnapshots, p);
      }
      if (!o.ok) {
        lost = o.lost;
        r = failed("save a snapshot of " + printable(op.key()) + " at " + std::to_string(op.snapshot.seq), o);
      }
      break;
    }
    case Kind::fence:
    case Kind::outbox: break;  // never routed here
  }
  if (lost) return r;
  Outcome end = run(c, r.ok() ? "RELEASE SAVEPOINT op" : "ROLLBACK TO SAVEPOINT op");
  if (!end.ok) {
    lost = true;
    return failed("end the savepoint", end);
  }
  return r;
}

Result<void> Writer::slow_append(AppendBatch& batch, bool& lost) {
  const std::string& id = batch.persistence_id;
  auto h = read_highest({id}, lost);
  if (!h) return std::move(h).error();
  const std::uint64_t highest = h->front().value();
  const std::uint64_t first = batch.events.front().seq;
  if (auto c = detail::check_continues(printable(id), first, highest); !c) return c;
  std::vector<const AppendBatch*> one{&batch};
  if (auto f = fence_check(shared_.options.schema, one)) {
    Outcome o = run_prepared(conn_.get(), Sql::kCheckFences, *f);
    if (!o.ok) {
      lost = o.lost;
      if (o.sqlstate == kFenceRefused) return fence_refused(batch, refused_at(o));
      return failed("check the fence of " + printable(id), o);
    }
  }
  const Call append = append_call(one);
  Outcome o = run_prepared(conn_.get(), append.name, append.params);
  if (!o.ok) {
    lost = o.lost;
    if (o.sqlstate == kUniqueViolation) return conflict(batch);
    return failed("append " + printable(id) + " seq " + std::to_string(first), o);
  }
  if (auto rows = outbox_rows(one)) {
    o = run_prepared(conn_.get(), Sql::kOutboxAppend, *rows);
    if (!o.ok) {
      lost = o.lost;
      if (o.sqlstate == kUniqueViolation) return outbox_conflict(batch);
      return failed("store the outbox records of " + printable(id) + " seq " + std::to_string(first), o);
    }
  }
  return {};
}

Result<std::uint64_t> Writer::raise(const std::string& key, std::uint64_t value, bool bump,
                                    Clock::time_point deadline) {
  const std::int64_t lock = fence_lock(shared_.options.schema, key);
  for (;;) {
    std::string why;
    if (!ensure_connected(deadline, why))
      return Error(ErrorCode::journal_failed, "postgres journal: raise the fence " + printable(key) +
                                                  ": the server is unreachable: " + why);
    PGconn* c = conn_.get();
    // The lock waits for the appends in flight under this fence and keeps
    // new ones out until the raise commits. lock_timeout bounds the wait.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    Outcome o = run(c, "BEGIN");
    if (o.ok) o = run(c, "SET LOCAL lock_timeout = " + std::to_string(std::max<long long>(left, 100)));
    if (o.ok) {
      Params p;
      p.int8(lock);
      o = run(c, "SELECT pg_advisory_xact_lock($1)", &p);
    }
    std::uint64_t stored = 0;
    if (o.ok) {
      Params p;
      p.bytes(key);
      if (!bump) p.int8(static_cast<std::int64_t>(value));
      o = run(c, bump ? shared_.sql.bump_fence : shared_.sql.raise_fence, &p);
      if (o.ok && PQntuples(o.res.get()) == 1 && PQgetlength(o.res.get(), 0, 0) == 8)
        stored = static_cast<std::uint64_t>(read_int8(PQgetvalue(o.res.get(), 0, 0)));
    }
    if (o.ok) o = run(c, "COMMIT");
    if (o.ok) return stored;
    if (o.lost && Clock::now() < deadline) {
      drop_connection();
      continue;
    }
    if (PQstatus(c) == CONNECTION_OK) (void)run(c, "ROLLBACK");
    return failed("raise the fence " + printable(key), o);
  }
}

Result<void> Writer::do_outbox(detail::OutboxWrite& op, Clock::time_point deadline) {
  Params p;
  const char* statement = nullptr;
  std::string doing;
  if (op.claim) {
    const OutboxClaim& c = *op.claim;
    p.bytes(c.owner);
    p.int8(static_cast<std::int64_t>(c.incarnation));
    p.int8(c.now_ms);
    p.int8(c.lease_ms);
    p.int8(static_cast<std::int64_t>(std::min<std::size_t>(c.limit, INT64_MAX)));
    statement = Sql::kOutboxClaim;
    doing = "claim outbox records";
  } else {
    const OutboxSettlement& st = *op.settlement;
    p.bytes(st.key);
    p.bytes(st.owner);
    p.int8(static_cast<std::int64_t>(st.incarnation));
    if (st.outcome == OutboxSettlement::Outcome::done) {
      statement = Sql::kOutboxSettleDone;
    } else {
      const bool retry = st.outcome == OutboxSettlement::Outcome::retry;
      p.int8(retry ? 0 : 1);
      p.int8(retry ? st.next_attempt_ms : 0);
      p.bytes(st.error);
      statement = Sql::kOutboxSettleUpdate;
    }
    doing = "settle the outbox record " + printable(st.key);
  }
  // One statement, one implicit transaction. A claim or settlement whose
  // connection broke may or may not have committed: it fails, and the
  // leases it may have taken run out.
  std::string why;
  if (!ensure_connected(deadline, why))
    return Error(ErrorCode::journal_failed, "postgres journal: " + doing + ": the server is unreachable: " + why);
  Outcome o = run_prepared(conn_.get(), statement, p);
  if (!o.ok) {
    if (o.lost) drop_connection();
    return failed(doing, o);
  }
  if (op.claim) {
    auto entries = parse_outbox_entries(o.res.get());
    if (!entries) return std::move(entries).error();
    op.claimed = std::move(*entries);
  }
  return {};
}

}  // namespace troupe::pg
