#pragma once
// The projection of the projection crash test (projection_crash.test.cpp
// and the child it SIGKILLs): every event of type "crash" into `applied`
// (primary key id, seq, so a second application fails its page) and added
// to `totals`, on an SQLite read model in the journal's file or a
// PostgreSQL one in the journal's schema. Test support only.

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "troupe/persist/postgres_read_model.hpp"
#include "troupe/persist/projection.hpp"
#include "troupe/persist/sqlite_read_model.hpp"

namespace troupe::test {

inline constexpr const char* kFoldKey = "fold/type:crash";

// Event `seq` of `id`: its amount is a function of both, so a fold can be
// checked against the journal.
inline std::int64_t fold_amount(const std::string& id, std::uint64_t seq) {
  return static_cast<std::int64_t>((seq * 7 + id.size()) % 100);
}
inline EventRecord fold_event(const std::string& id, std::uint64_t seq) {
  EventRecord e;
  e.seq = seq;
  e.timestamp_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  e.type = "crash.Event";
  e.version = 1;
  e.payload = std::to_string(fold_amount(id, seq));
  return e;
}

template <class Model>
struct Fold {
  using ReadModel = Model;
  Result<void> setup(typename Model::Transaction& tx) {
    if (auto r = tx.exec("CREATE TABLE IF NOT EXISTS applied (id TEXT NOT NULL, seq BIGINT NOT NULL, "
                         "amount BIGINT NOT NULL, PRIMARY KEY (id, seq))");
        !r)
      return r;
    return tx.exec("CREATE TABLE IF NOT EXISTS totals (id TEXT PRIMARY KEY, n BIGINT NOT NULL, total BIGINT NOT NULL)");
  }
  Result<void> apply(typename Model::Transaction& tx, const StreamEvent& e) {
    const std::int64_t amount = std::stoll(e.event.payload);
    if (auto r = tx.exec(insert_applied(), {e.persistence_id, static_cast<std::int64_t>(e.event.seq), amount}); !r)
      return r;
    return tx.exec(upsert_total(), {e.persistence_id, amount});
  }
  static const char* insert_applied() {
    if constexpr (std::is_same_v<Model, SqliteReadModel>) return "INSERT INTO applied (id, seq, amount) VALUES (?1, ?2, ?3)";
    else return "INSERT INTO applied (id, seq, amount) VALUES ($1, $2, $3)";
  }
  static const char* upsert_total() {
    if constexpr (std::is_same_v<Model, SqliteReadModel>)
      return "INSERT INTO totals (id, n, total) VALUES (?1, 1, ?2) ON CONFLICT (id) DO UPDATE SET n = n + 1, "
             "total = total + excluded.total";
    else
      return "INSERT INTO totals (id, n, total) VALUES ($1, 1, $2) ON CONFLICT (id) DO UPDATE SET n = totals.n + 1, "
             "total = totals.total + excluded.total";
  }
};

// A running fold projection, whichever its read model.
struct FoldProjection {
  std::function<ProjectionStatus()> status;
  std::function<bool(const std::function<bool(const ProjectionStatus&)>&, Duration)> wait_until;
  std::function<void()> stop;
};

template <class Model>
Result<FoldProjection> start_fold_on(ActorSystem& system, std::shared_ptr<Journal> journal, std::shared_ptr<Model> model) {
  ProjectionSettings s;
  s.name = "fold";
  s.source = EventSelector::of_type("crash");
  s.batch = 64;
  s.poll_interval = std::chrono::milliseconds(200);
  auto p = Projection<Fold<Model>>::start(system, std::move(journal), std::move(model), s);
  if (!p) return std::move(p).error();
  auto shared = std::make_shared<Projection<Fold<Model>>>(std::move(*p));
  return FoldProjection{[shared] { return shared->status(); },
                        [shared](const std::function<bool(const ProjectionStatus&)>& f, Duration d) {
                          return shared->wait_until(f, d);
                        },
                        [shared] { shared->stop(); }};
}

// On an SQLite read model in `path` (the journal's file, opened first).
inline Result<FoldProjection> start_fold(ActorSystem& system, std::shared_ptr<Journal> journal, const std::string& path) {
  auto m = SqliteReadModel::open({.path = path});
  if (!m) return std::move(m).error();
  return start_fold_on(system, std::move(journal), *m);
}

// On a PostgreSQL read model in `schema`.
inline Result<FoldProjection> start_fold(ActorSystem& system, std::shared_ptr<Journal> journal,
                                         const std::string& conninfo, const std::string& schema) {
  auto m = PostgresReadModel::open({conninfo, schema});
  if (!m) return std::move(m).error();
  return start_fold_on(system, std::move(journal), *m);
}

}  // namespace troupe::test
