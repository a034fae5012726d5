// The read model equals a fold of the journal after every SIGKILL (SPEC R1;
// the kill -9 cycle bar of the read side): a child process appends and
// projects into the journal's own database and is killed again and again,
// on SQLite, and on PostgreSQL with a second process appending at the same
// time (transactions committing out of order: the gap problem). After every
// kill the events in `applied` are exactly the journal's events up to the
// stored offset (none twice, none skipped) and `totals` is their fold; at
// the end a projection in this process catches up with all of them.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../journal_test_support.hpp"
#include "../postgres/postgres_test_server.hpp"
#include "projection_crash_fold.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/persist/postgres_journal.hpp"
#include "troupe/persist/sqlite_journal.hpp"

#ifdef TROUPE_PROJECTION_CRASH_CHILD

namespace {

using namespace std::chrono_literals;
using namespace troupe::test::journal_names;
using troupe::JournalOffset;
using troupe::SqlRow;

pid_t spawn(std::vector<std::string> args) {
  args.insert(args.begin(), TROUPE_PROJECTION_CRASH_CHILD);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Kills `pid` with SIGKILL; false (and a failure) if it had died before.
bool kill_hard(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) {
    ADD_FAILURE() << "the child exited by itself with status " << status;
    return false;
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

using Key = std::tuple<std::string, std::uint64_t>;

class ProjectionCrash : public ::testing::TestWithParam<std::string> {
 protected:
  bool sqlite() const { return GetParam() == "sqlite"; }

  void SetUp() override {
    if (sqlite()) {
      path_ = dir_.file("journal.db");
    } else {
      conninfo_ = troupe::test::shared_postgres_conninfo();
      schema_ = troupe::test::fresh_schema();
    }
    auto j = open_journal();
    ASSERT_TRUE(j) << "cannot open the journal";
    ASSERT_TRUE(j->supports_queries()) << GetParam() << " keeps no global order";
  }

  std::shared_ptr<Journal> open_journal() {
    if (sqlite()) {
      auto j = troupe::SqliteJournal::open({.path = path_});
      if (!j) ADD_FAILURE() << j.error().to_string();
      return j ? std::shared_ptr<Journal>(*j) : nullptr;
    }
    troupe::PostgresJournalOptions o;
    o.conninfo = conninfo_;
    o.schema = schema_;
    auto j = troupe::PostgresJournal::open(o);
    if (!j) ADD_FAILURE() << j.error().to_string();
    return j ? std::shared_ptr<Journal>(*j) : nullptr;
  }

  std::vector<pid_t> start_children(int cycle) {
    const std::string prefix = "c" + std::to_string(cycle);
    if (sqlite()) return {spawn({"sqlite", path_, "both", prefix})};
    // Two processes append to one schema at once; only one projects.
    return {spawn({"postgres", conninfo_, schema_, "both", prefix + "a"}),
            spawn({"postgres", conninfo_, schema_, "writer", prefix + "b"})};
  }

  // Every event of type "crash" in the journal, in its order.
  std::vector<troupe::StreamEvent> journal_events(Journal& j) {
    std::vector<troupe::StreamEvent> out;
    JournalOffset after{};
    for (;;) {
      auto page = js::query_events(j, {troupe::EventSelector::of_type("crash"), after, 5000});
      EXPECT_TRUE(page.ok()) << page.error().to_string();
      if (!page.ok() || page->events.empty()) return out;
      for (auto& e : page->events) out.push_back(std::move(e));
      after = out.back().offset;
    }
  }

  struct Model {
    std::optional<JournalOffset> offset;
    std::map<Key, std::int64_t> applied;
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> totals;  // id -> (n, total)
  };

  template <class M>
  Model read_model(M& m) {
    Model out;
    auto o = m.load_offset(troupe::test::kFoldKey);
    EXPECT_TRUE(o.ok()) << o.error().to_string();
    if (!o.ok() || !*o) return out;  // killed before the first page: nothing applied
    out.offset = *o;
    auto rows = m.query("SELECT id, seq, amount FROM applied");
    EXPECT_TRUE(rows.ok()) << rows.error().to_string();
    for (const SqlRow& r : rows.value_or(std::vector<SqlRow>{}))
      out.applied[{std::get<std::string>(r[0]), static_cast<std::uint64_t>(std::get<std::int64_t>(r[1]))}] =
          std::get<std::int64_t>(r[2]);
    auto totals = m.query("SELECT id, n, total FROM totals");
    EXPECT_TRUE(totals.ok());
    for (const SqlRow& r : totals.value_or(std::vector<SqlRow>{}))
      out.totals[std::get<std::string>(r[0])] = {std::get<std::int64_t>(r[1]), std::get<std::int64_t>(r[2])};
    return out;
  }

  Model read_model() {
    if (sqlite()) {
      auto m = troupe::SqliteReadModel::open({.path = path_});
      EXPECT_TRUE(m.ok());
      return read_model(**m);
    }
    auto m = troupe::PostgresReadModel::open({conninfo_, schema_});
    EXPECT_TRUE(m.ok());
    return read_model(**m);
  }

  // The read model holds exactly the journal's events up to its offset.
  // Returns how many that is.
  std::size_t check(const std::vector<troupe::StreamEvent>& events, const Model& m, const std::string& when) {
    std::map<Key, std::int64_t> expected;
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> totals;
    for (const auto& e : events) {
      if (!m.offset || m.offset < e.offset) break;
      const std::int64_t amount = troupe::test::fold_amount(e.persistence_id, e.event.seq);
      EXPECT_EQ(e.event.payload, std::to_string(amount)) << e.persistence_id << "#" << e.event.seq;
      expected[{e.persistence_id, e.event.seq}] = amount;
      auto& t = totals[e.persistence_id];
      ++t.first;
      t.second += amount;
    }
    for (const auto& [k, amount] : m.applied)
      EXPECT_TRUE(expected.count(k)) << when << ": " << std::get<0>(k) << "#" << std::get<1>(k)
                                     << " applied but not in the journal up to the offset";
    for (const auto& [k, amount] : expected)
      EXPECT_TRUE(m.applied.count(k)) << when << ": " << std::get<0>(k) << "#" << std::get<1>(k)
                                      << " skipped: in the journal before the offset, not applied";
    EXPECT_EQ(m.applied.size(), expected.size()) << when;
    EXPECT_EQ(m.totals, totals) << when << ": the totals are not the fold of the applied events";
    return expected.size();
  }

  troupe::test::TempDir dir_;
  std::string path_, conninfo_, schema_;
};

// proves: R1
TEST_P(ProjectionCrash, the_read_model_equals_a_fold_of_the_journal_after_every_sigkill) {
  std::mt19937 rng(20261128);
  std::size_t applied = 0, stored = 0;
  constexpr int kCycles = 6;
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    auto children = start_children(cycle);
    std::this_thread::sleep_for(std::chrono::milliseconds(400 + rng() % 600));
    for (pid_t c : children) ASSERT_TRUE(kill_hard(c)) << "cycle " << cycle;
    auto j = open_journal();
    ASSERT_TRUE(j);
    auto events = journal_events(*j);
    j.reset();
    applied = check(events, read_model(), "after kill " + std::to_string(cycle + 1));
    stored = events.size();
    if (HasFailure()) return;
  }
  EXPECT_GT(stored, 1000u) << "the children stored too little to prove anything";
  EXPECT_GT(applied, 0u) << "the projection never committed a page before a kill";

  // Caught up at the end: every event, once.
  auto j = open_journal();
  ASSERT_TRUE(j);
  troupe::ActorSystem system(troupe::SystemConfig{.threads = 2});
  auto p = sqlite() ? troupe::test::start_fold(system, j, path_) : troupe::test::start_fold(system, j, conninfo_, schema_);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  ASSERT_TRUE(p->wait_until([&](const troupe::ProjectionStatus& s) { return s.caught_up && s.events_applied > 0; }, 60s) ||
              applied == stored);
  p->stop();
  system.shutdown();
  auto events = journal_events(*j);
  EXPECT_EQ(check(events, read_model(), "caught up"), events.size());
}

INSTANTIATE_TEST_SUITE_P(SqliteAndPostgres, ProjectionCrash, ::testing::Values("sqlite", "postgres"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace

#endif  // TROUPE_PROJECTION_CRASH_CHILD
