// The PostgreSQL journal's global order (event_query.hpp, SPEC R1): the
// visibility rule with transactions that commit out of order (raw libpq
// sessions), LISTEN/NOTIFY between journals on one schema, the migration of
// a schema from before the order, and kill -9 cycles of a writer with
// several lanes while a reader pages through the order. The shared query
// guarantees are in src/persist/journal_query_contract.test.cpp.

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../crash_writer.hpp"
#include "../journal_test_support.hpp"
#include "postgres_test_server.hpp"
#include "troupe/persist/postgres_journal.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::test::journal_names;
using troupe::EventQuery;
using troupe::EventSelector;
using troupe::JournalOffset;
using troupe::PostgresJournal;
using troupe::PostgresJournalOptions;
using troupe::StreamEvent;

std::shared_ptr<PostgresJournal> open_journal(const std::string& conninfo, const std::string& schema,
                                              unsigned lanes = 1) {
  PostgresJournalOptions o;
  o.conninfo = conninfo;
  o.schema = schema;
  o.writer_connections = lanes;
  auto j = PostgresJournal::open(o);
  if (!j.ok()) throw std::runtime_error(j.error().to_string());
  return *j;
}

// A plain libpq session, for transactions the test holds open.
class Session {
 public:
  explicit Session(const std::string& conninfo) : c_(PQconnectdb(conninfo.c_str())) {
    if (PQstatus(c_) != CONNECTION_OK) throw std::runtime_error(PQerrorMessage(c_));
  }
  ~Session() { PQfinish(c_); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  // Runs `sql`; the first column of the first row as text ("" for none).
  std::string exec(const std::string& sql) {
    PGresult* r = PQexec(c_, sql.c_str());
    const auto st = PQresultStatus(r);
    std::string out;
    if (st == PGRES_TUPLES_OK && PQntuples(r) > 0) out = PQgetvalue(r, 0, 0);
    std::string err = PQresultErrorMessage(r);
    PQclear(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) throw std::runtime_error(sql + ": " + err);
    return out;
  }

 private:
  PGconn* c_;
};

std::string insert_sql(const std::string& schema, const std::string& id) {
  return "INSERT INTO \"" + schema + "\".events (persistence_id, seq, timestamp_ms, type, version, payload) "
         "VALUES ('" + id + "'::bytea, 1, 1, 'test.Event'::bytea, 1, 'p'::bytea) RETURNING ordering";
}

std::vector<StreamEvent> read_after(Journal& j, const EventSelector& sel, JournalOffset after = {}) {
  std::vector<StreamEvent> out;
  for (;;) {
    auto r = js::query_events(j, EventQuery{sel, after, 100});
    if (!r.ok()) throw std::runtime_error(r.error().to_string());
    if (r->events.empty()) return out;
    for (auto& e : r->events) out.push_back(std::move(e));
    after = out.back().offset;
  }
}

// Reads after `after` until `n` events came (other sessions on the shared
// server may hold the order back for a moment) or 20 s passed.
std::vector<StreamEvent> read_at_least(Journal& j, const EventSelector& sel, std::size_t n, JournalOffset after = {}) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  for (;;) {
    auto got = read_after(j, sel, after);
    if (got.size() >= n || std::chrono::steady_clock::now() > deadline) return got;
    std::this_thread::sleep_for(20ms);
  }
}

std::vector<std::string> ids_of(const std::vector<StreamEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.persistence_id);
  return out;
}

// A takes the lower ordering (and the older transaction id), B commits
// first: until A ends, B is not returned, nor A; then both, A first, and a
// reader that had read nothing misses neither.
// proves: R1
TEST(PostgresQuery, an_open_transaction_holding_a_lower_ordering_hides_later_commits_until_it_ends) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  auto j = open_journal(conninfo, schema);
  Session a(conninfo), b(conninfo);
  a.exec("BEGIN");
  const long ord_a = std::stol(a.exec(insert_sql(schema, "gap|a")));
  b.exec("BEGIN");
  const long ord_b = std::stol(b.exec(insert_sql(schema, "gap|b")));
  ASSERT_LT(ord_a, ord_b);
  b.exec("COMMIT");
  const auto sel = EventSelector::of_type("gap");
  EXPECT_TRUE(read_after(*j, sel).empty()) << "an event was returned while an older transaction was open";
  a.exec("COMMIT");
  auto both = read_at_least(*j, sel, 2);
  EXPECT_EQ(ids_of(both), (std::vector<std::string>{"gap|a", "gap|b"}));
  ASSERT_EQ(both.size(), 2u);
  EXPECT_LT(both[0].offset, both[1].offset);
  EXPECT_EQ(both[0].offset.ordering, static_cast<std::uint64_t>(ord_a));
}

// B has the older transaction id, A the lower ordering; B commits first and
// is read; A commits later and still comes, after B: with the sequence
// alone as the offset, A (below B's number) would be skipped.
// proves: R1
TEST(PostgresQuery, an_event_committed_late_under_a_lower_ordering_comes_after_those_already_read) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  auto j = open_journal(conninfo, schema);
  Session a(conninfo), b(conninfo);
  b.exec("BEGIN");
  b.exec("SELECT pg_current_xact_id()");  // B's transaction id is the older
  a.exec("BEGIN");
  const long ord_a = std::stol(a.exec(insert_sql(schema, "gap|a")));
  const long ord_b = std::stol(b.exec(insert_sql(schema, "gap|b")));
  ASSERT_LT(ord_a, ord_b);
  b.exec("COMMIT");
  const auto sel = EventSelector::of_type("gap");
  auto first = read_at_least(*j, sel, 1);
  ASSERT_EQ(ids_of(first), (std::vector<std::string>{"gap|b"}));
  a.exec("COMMIT");
  auto later = read_at_least(*j, sel, 1, first.back().offset);
  ASSERT_EQ(ids_of(later), (std::vector<std::string>{"gap|a"}));
  EXPECT_LT(first.back().offset, later[0].offset);
  EXPECT_EQ(ids_of(read_after(*j, sel)), (std::vector<std::string>{"gap|b", "gap|a"}));
}

// A query made after an append returned, while an older transaction is
// open for a moment, waits it out and returns the append (a short page is
// not ended at the horizon while committed events wait behind it).
TEST(PostgresQuery, a_query_after_an_append_waits_out_a_short_older_transaction_and_returns_the_append) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  auto j = open_journal(conninfo, troupe::test::fresh_schema());
  Session a(conninfo);
  a.exec("BEGIN");
  a.exec("SELECT pg_current_xact_id()");  // older than the append's
  ASSERT_TRUE(js::append(*j, batch("wait|x", 1, 1)).ok());
  std::thread commit_later([&] {
    std::this_thread::sleep_for(300ms);
    a.exec("COMMIT");
  });
  auto r = js::query_events(*j, EventQuery{EventSelector::of_type("wait"), {}, 10});
  commit_later.join();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(ids_of(r->events), (std::vector<std::string>{"wait|x"}));
}

// proves: R1
TEST(PostgresQuery, a_journal_hears_within_seconds_that_another_on_its_schema_appended_also_after_a_reconnect) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  const std::string app = "listen_" + schema;
  auto listening = open_journal(conninfo + " application_name=" + app, schema);
  auto writing = open_journal(conninfo, schema);
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  const std::uint64_t id = listening->add_append_listener([&] {
    std::lock_guard lk(mu);
    ++calls;
    cv.notify_all();
  });
  auto heard = [&] {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, 5s, [&] { return calls > 0; });
  };
  ASSERT_TRUE(js::append(*writing, batch("live|a", 1, 1)).ok());
  ASSERT_TRUE(heard()) << "no announcement from the other journal within 5 s";
  EXPECT_EQ(ids_of(read_at_least(*listening, EventSelector::of_type("live"), 1)),
            (std::vector<std::string>{"live|a"}));

  // Cut the listening connection; the announcer makes a new one.
  Session admin(conninfo);
  const std::string old_pid = admin.exec("SELECT pid FROM pg_stat_activity WHERE application_name = '" + app +
                                         "' AND (query LIKE 'LISTEN%' OR query LIKE 'NOTIFY%')");
  ASSERT_FALSE(old_pid.empty());
  admin.exec("SELECT pg_terminate_backend(" + old_pid + ")");
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  std::string new_pid;
  while (std::chrono::steady_clock::now() < deadline && (new_pid.empty() || new_pid == old_pid)) {
    std::this_thread::sleep_for(20ms);
    new_pid = admin.exec("SELECT pid FROM pg_stat_activity WHERE application_name = '" + app +
                         "' AND (query LIKE 'LISTEN%' OR query LIKE 'NOTIFY%')");
  }
  ASSERT_FALSE(new_pid.empty());
  ASSERT_NE(new_pid, old_pid);
  std::this_thread::sleep_for(100ms);
  {
    std::lock_guard lk(mu);
    calls = 0;
  }
  ASSERT_TRUE(js::append(*writing, batch("live|a", 2, 2)).ok());
  EXPECT_TRUE(heard()) << "no announcement after the listening connection was made again";
  listening->remove_append_listener(id);
}

TEST(PostgresQuery, a_schema_from_before_the_order_gains_it_on_open_keeping_each_ids_order_and_its_numbers) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  {
    auto j = open_journal(conninfo, schema);
    ASSERT_TRUE(js::append(*j, batch("old|a", 1, 2)).ok());
    ASSERT_TRUE(js::append(*j, batch("old|b", 1, 1)).ok());
    ASSERT_TRUE(js::append(*j, batch("old|a", 3, 3)).ok());
  }
  // Back to layout 2: no order, no tags.
  const std::string s = "\"" + schema + "\"";
  Session admin(conninfo);
  admin.exec("DROP TABLE " + s + ".event_tags; ALTER TABLE " + s + ".events DROP COLUMN entity_type, "
             "DROP COLUMN tags, DROP COLUMN tx, DROP COLUMN ordering; UPDATE " + s +
             ".journal_schema SET version = 2");
  std::vector<StreamEvent> migrated;
  {
    auto j = open_journal(conninfo, schema);
    migrated = read_after(*j, EventSelector::of_type("old"));
    ASSERT_EQ(migrated.size(), 4u);
    std::map<std::string, std::uint64_t> next;
    for (std::size_t i = 0; i < migrated.size(); ++i) {
      EXPECT_EQ(migrated[i].offset.tx, 0u);
      EXPECT_EQ(migrated[i].event.seq, ++next[migrated[i].persistence_id]);
      if (i > 0) {
        EXPECT_LT(migrated[i - 1].offset, migrated[i].offset);
      }
    }
    AppendBatch b = batch("old|a", 4, 4);
    b.events[0].tags = {"after"};
    ASSERT_TRUE(js::append(*j, b).ok());
    auto rest = read_at_least(*j, EventSelector::of_type("old"), 1, migrated.back().offset);
    ASSERT_EQ(rest.size(), 1u);
    EXPECT_EQ(rest[0].event.seq, 4u);
    EXPECT_EQ(ids_of(read_at_least(*j, EventSelector::with_tag("after"), 1)), (std::vector<std::string>{"old|a"}));
    EXPECT_EQ(js::recover(*j, "old|a")->events.size(), 4u);
  }
  // Opening again changes nothing: the same numbers.
  auto j = open_journal(conninfo, schema);
  auto again = read_after(*j, EventSelector::of_type("old"));
  ASSERT_EQ(again.size(), 5u);
  for (std::size_t i = 0; i < migrated.size(); ++i) EXPECT_EQ(again[i].offset, migrated[i].offset);
  EXPECT_EQ(admin.exec("SELECT version FROM " + s + ".journal_schema"), "3");
}

TEST(PostgresQuery, offsets_no_journal_gave_are_answered_by_the_order_not_refused) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  auto j = open_journal(conninfo, troupe::test::fresh_schema());
  ASSERT_TRUE(js::append(*j, batch("odd|a", 1, 2)).ok());
  const auto sel = EventSelector::of_type("odd");
  auto all = read_at_least(*j, sel, 2);
  ASSERT_EQ(all.size(), 2u);
  // Beyond every transaction: nothing (not an error).
  EXPECT_TRUE(read_after(*j, sel, JournalOffset{UINT64_MAX, UINT64_MAX}).empty());
  // An ordering above any bigint in the first event's transaction: the
  // events of later transactions only (none here, both share one).
  EXPECT_TRUE(read_after(*j, sel, JournalOffset{all[0].offset.tx, UINT64_MAX}).empty());
  // Just below the first event's transaction: both.
  EXPECT_EQ(read_after(*j, sel, JournalOffset{all[0].offset.tx - 1, UINT64_MAX}).size(), 2u);
  // Offsets printed and parsed back resume in the same place.
  auto parsed = troupe::parse_offset(all[0].offset.to_string());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(read_after(*j, sel, *parsed).size(), 1u);
}

#ifdef TROUPE_PG_CRASH_WRITER

using troupe::test::crash_payload;

// Starts the writer; returns its pid and the read end of its stdout.
pid_t start_writer(const std::string& conninfo, const std::string& schema, int& out) {
  std::vector<std::string> args = {TROUPE_PG_CRASH_WRITER, conninfo, schema, "4", "4", "6"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t child = fork();
  if (child == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  out = fds[0];
  return child;
}

// Reads acknowledgements ("<id> <seq>") from `fd` until it is empty (or,
// with `block`, until `until`); the highest seq per id into `acked`.
void read_acks(int fd, std::string& buffer, std::map<std::string, std::uint64_t>& acked, std::size_t& acks,
               std::chrono::steady_clock::time_point until) {
  char chunk[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::max<long>(left.count(), 0))) <= 0) return;
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n <= 0) return;
    buffer.append(chunk, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      std::istringstream line(buffer.substr(0, nl));
      buffer.erase(0, nl + 1);
      std::string id;
      std::uint64_t seq = 0;
      line >> id >> seq;
      acked[id] = std::max(acked[id], seq);
      ++acks;
    }
  }
}

// A writer with four lanes is SIGKILLed again and again while the test
// pages through the order; after every cycle, once the killed writer's
// transactions have ended, the events read are exactly the stored ones:
// each id's replay, none skipped, none twice, offsets only growing.
// proves: R1
TEST(PostgresQuery, kill_9_cycles_of_a_writer_with_four_lanes_leave_the_order_read_equal_to_the_stored_logs) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  const std::string app = "crash_" + schema;
  auto j = open_journal(conninfo, schema);
  Session admin(conninfo);
  const auto sel = EventSelector::of_type("crash");
  JournalOffset after{};
  std::map<std::string, std::vector<std::uint64_t>> read;  // id -> seqs in the order read
  std::size_t events_read = 0;
  auto page_once = [&] {
    auto r = js::query_events(*j, EventQuery{sel, after, 37});
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    if (!r.ok()) return false;
    for (const auto& e : r->events) {
      EXPECT_LT(after, e.offset);
      after = e.offset;
      EXPECT_EQ(e.event.payload, crash_payload(e.persistence_id, e.event.seq));
      EXPECT_EQ(e.event.tags, (std::vector<std::string>{"crash-" + std::to_string(e.event.seq % 2)}));
      read[e.persistence_id].push_back(e.event.seq);
      ++events_read;
    }
    return !r->events.empty();
  };
  std::map<std::string, std::uint64_t> acked;
  std::size_t acks = 0;
  for (int cycle = 0; cycle < 6; ++cycle) {
    int out = -1;
    const pid_t child = start_writer(conninfo + " application_name=" + app, schema, out);
    ASSERT_GT(child, 0);
    std::string buffer;
    const auto kill_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(300 + 97 * cycle);
    while (std::chrono::steady_clock::now() < kill_at) {
      read_acks(out, buffer, acked, acks, std::chrono::steady_clock::now() + 5ms);
      page_once();
    }
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the writer died by itself, status " << status;
    read_acks(out, buffer, acked, acks, std::chrono::steady_clock::now());
    close(out);
    // The server ends the killed writer's sessions (and their transactions).
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (admin.exec("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app + "'") != "0") {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the killed writer's sessions did not end";
      std::this_thread::sleep_for(10ms);
    }
    // Drain what is visible now; wait out other sessions that may still
    // hold the order back (other tests share the server).
    std::size_t stored = 0;
    std::map<std::string, std::vector<std::uint64_t>> logs;
    for (int t = 0; t < 4; ++t)
      for (int k = 0; k < 6; ++k) {
        const std::string id = "crash|" + std::to_string(t) + "-" + std::to_string(k);
        auto r = js::replay(*j, id);
        ASSERT_TRUE(r.ok()) << r.error().to_string();
        for (const auto& e : *r) logs[id].push_back(e.seq);
        stored += r->size();
        if (acked.contains(id)) {
          ASSERT_TRUE(logs.contains(id)) << id;
          EXPECT_GE(logs[id].back(), acked[id]) << id << ": an acknowledged event is not stored";
        }
      }
    const auto drain_deadline = std::chrono::steady_clock::now() + 20s;
    while (events_read < stored && std::chrono::steady_clock::now() < drain_deadline)
      if (!page_once()) std::this_thread::sleep_for(10ms);
    while (page_once()) {
    }
    EXPECT_EQ(read, logs) << "cycle " << cycle << ": the order read differs from the stored logs";
    EXPECT_EQ(events_read, stored) << "cycle " << cycle;
  }
  EXPECT_EQ(acked.size(), 24u);
  EXPECT_GE(acks, 200u);
  // The tags index holds the same events, split by tag.
  std::size_t tagged = read_after(*j, EventSelector::with_tag("crash-0")).size() +
                       read_after(*j, EventSelector::with_tag("crash-1")).size();
  EXPECT_EQ(tagged, events_read);
}

#endif  // TROUPE_PG_CRASH_WRITER

}  // namespace
