// SqliteJournal: the lock file, one writer lane (sqlite_writer.cpp) and the
// reader connections (sqlite_reader.cpp), run by the group-commit engine
// (journal_engine.hpp). Table layout, encoding and the rules enforced are
// documented in doc/journal.md; keep the two in step.

#include "troupe/persist/sqlite_journal.hpp"

#include <memory>
#include <utility>
#include <vector>

#include "../journal_engine.hpp"
#include "sqlite_reader.hpp"
#include "sqlite_support.hpp"
#include "sqlite_writer.hpp"

namespace troupe {
namespace {

// Everything the journal's threads use. Held by shared_ptr: by the public
// object (through its engine) and by each thread, so that the journal may be
// destroyed from one of its own callbacks. Member order does the rest on
// destruction: the engine goes first (its statements finalize, its
// connections close), then the lock file is released.
struct SqliteState {
  explicit SqliteState(SqliteJournalOptions o)
      : options(std::move(o)),
        engine({options.max_batch_events, 1, [path = options.path] { return sqlite::closed_error(path); },
                /*queries=*/true}) {}

  Result<void> open() {
    if (auto r = lock.acquire(options.path); !r) return r;
    auto writer = std::make_unique<sqlite::Writer>(options);
    if (auto r = writer->open(); !r) return r;
    std::vector<std::unique_ptr<detail::JournalLane>> lanes;
    lanes.push_back(std::move(writer));
    std::vector<std::unique_ptr<detail::JournalReader>> readers;
    for (unsigned i = 0; i < options.reader_threads; ++i) {
      auto reader = std::make_unique<sqlite::Reader>(options);
      if (auto r = reader->open(); !r) return r;
      readers.push_back(std::move(reader));
    }
    engine.open(std::move(lanes), std::move(readers));
    return {};
  }

  const SqliteJournalOptions options;
  sqlite::LockFile lock;
  detail::JournalEngine engine;
};

}  // namespace

Result<std::shared_ptr<SqliteJournal>> SqliteJournal::open(SqliteJournalOptions options) {
  if (options.path.empty() || options.path == ":memory:")
    return Error(ErrorCode::invalid_argument, "sqlite journal: the path must name a file");
  if (options.max_batch_events == 0)
    return Error(ErrorCode::invalid_argument, "sqlite journal: max_batch_events must be at least 1");
  if (options.reader_threads == 0)
    return Error(ErrorCode::invalid_argument, "sqlite journal: reader_threads must be at least 1");
  if (options.busy_timeout_ms < 0)
    return Error(ErrorCode::invalid_argument, "sqlite journal: busy_timeout_ms must not be negative");
  auto state = std::make_shared<SqliteState>(std::move(options));
  if (auto r = state->open(); !r) return std::move(r).error();
  state->engine.start(state);
  // The engine's handle shares ownership of the whole state.
  std::shared_ptr<detail::JournalEngine> engine(state, &state->engine);
  return std::shared_ptr<SqliteJournal>(new SqliteJournal(std::move(engine)));
}

SqliteJournal::SqliteJournal(std::shared_ptr<detail::JournalEngine> engine)
    : GroupCommitJournal(std::move(engine)) {}

}  // namespace troupe
