#pragma once
// The journal back ends the contract suites run against (the journal
// contract, journal_contract.test.cpp; the outbox contract,
// outbox_contract.test.cpp): one fresh journal per test. A back end joins
// by adding one factory to back_ends().

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "journal_test_support.hpp"
#include "postgres/postgres_test_server.hpp"
#include "troupe/persist/journal.hpp"
#include "troupe/persist/memory_journal.hpp"
#include "troupe/persist/postgres_journal.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace troupe::test {

// One back end under test, fresh for each test: owns the journal and
// whatever it stores into. close() destroys the journal (its destructor
// finishes what is queued) and keeps the storage.
class JournalUnderTest {
 public:
  virtual ~JournalUnderTest() = default;
  virtual troupe::Journal& journal() = 0;
  virtual void close() = 0;
};

class MemoryUnderTest final : public JournalUnderTest {
 public:
  troupe::Journal& journal() override { return *journal_; }
  void close() override { journal_.reset(); }

 private:
  std::unique_ptr<troupe::MemoryJournal> journal_ = std::make_unique<troupe::MemoryJournal>();
};

class SqliteUnderTest final : public JournalUnderTest {
 public:
  SqliteUnderTest() {
    troupe::SqliteJournalOptions options;
    options.path = dir_.file("journal.db");
    auto j = troupe::SqliteJournal::open(options);
    if (!j.ok()) throw std::runtime_error(j.error().to_string());
    journal_ = std::move(*j);
  }
  troupe::Journal& journal() override { return *journal_; }
  void close() override { journal_.reset(); }

 private:
  TempDir dir_;  // declared first: outlives the journal
  std::shared_ptr<troupe::SqliteJournal> journal_;
};

// A fresh schema on the shared test server (postgres_test_server.hpp), so
// each test sees only its own rows. `lanes` writer connections: the default
// one, or several, where ids and fence keys spread over lanes.
class PostgresUnderTest final : public JournalUnderTest {
 public:
  explicit PostgresUnderTest(unsigned lanes) {
    troupe::PostgresJournalOptions options;
    options.conninfo = troupe::test::shared_postgres_conninfo();
    options.schema = troupe::test::fresh_schema();
    options.writer_connections = lanes;
    auto j = troupe::PostgresJournal::open(options);
    if (!j.ok()) throw std::runtime_error(j.error().to_string());
    journal_ = std::move(*j);
  }
  troupe::Journal& journal() override { return *journal_; }
  void close() override { journal_.reset(); }

 private:
  std::shared_ptr<troupe::PostgresJournal> journal_;
};

struct BackEnd {
  std::string name;
  std::function<std::unique_ptr<JournalUnderTest>()> make;
};
// How GoogleTest shows a parameter in listings and failures.
inline void PrintTo(const BackEnd& b, std::ostream* os) { *os << b.name; }

inline std::vector<BackEnd> back_ends() {
  return {
      {"memory", [] { return std::make_unique<MemoryUnderTest>(); }},
      {"sqlite", [] { return std::make_unique<SqliteUnderTest>(); }},
      {"postgres", [] { return std::make_unique<PostgresUnderTest>(troupe::PostgresJournalOptions().writer_connections); }},
      {"postgres_4_lanes", [] { return std::make_unique<PostgresUnderTest>(4); }},
  };
}

}  // namespace troupe::test
