// The SQLite journal's shared helpers: error messages, running statements,
// and the lock file (sqlite_support.hpp).

#include "sqlite_support.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>

namespace troupe::sqlite {

std::string quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

Error failed(const std::string& path, std::string_view doing, sqlite3* db) {
  std::string m = "sqlite journal " + quoted(path) + ": " + std::string(doing) + ": ";
  m += db != nullptr ? sqlite3_errmsg(db) : "out of memory";
  if (db != nullptr) m += " (SQLite code " + std::to_string(sqlite3_extended_errcode(db)) + ")";
  return Error(ErrorCode::journal_failed, std::move(m));
}

Result<void> exec(sqlite3* db, const std::string& path, const char* sql, std::string_view doing) {
  if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return failed(path, doing, db);
  return {};
}

Result<void> prepare(sqlite3* db, const std::string& path, const char* sql, Stmt& out) {
  if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, out.out(), nullptr) != SQLITE_OK)
    return failed(path, std::string("prepare \"") + sql + "\"", db);
  return {};
}

Result<void> prepare_all(sqlite3* db, const std::string& path, std::initializer_list<Prepared> statements) {
  for (const Prepared& p : statements)
    if (auto r = prepare(db, path, p.sql, *p.stmt); !r) return r;
  return {};
}

// Runs a statement that returns no rows (BEGIN, COMMIT, SAVEPOINT, ...).
Result<void> run(sqlite3* db, const std::string& path, sqlite3_stmt* s, std::string_view doing) {
  int rc = sqlite3_step(s);
  Result<void> r;
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) r = failed(path, doing, db);
  sqlite3_reset(s);
  return r;
}

std::string join_tags(const std::vector<std::string>& tags) {
  std::string out;
  for (std::size_t i = 0; i < tags.size(); ++i) {
    if (i > 0) out += kTagSeparator;
    out += tags[i];
  }
  return out;
}

const char* type_name(int t) {
  switch (t) {
    case SQLITE_INTEGER: return "INTEGER";
    case SQLITE_FLOAT: return "REAL";
    case SQLITE_TEXT: return "TEXT";
    case SQLITE_BLOB: return "BLOB";
    default: return "NULL";
  }
}

Error closed_error(const std::string& path) {
  return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(path) + " is closed");
}

LockFile::~LockFile() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor drops the flock
}

Result<void> LockFile::acquire(const std::string& db_path) {
  std::string p = db_path + ".lock";
  fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(db_path) + ": cannot create lock file " +
                                                quoted(p) + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    std::string why = e == EWOULDBLOCK ? "the journal is already open (another process, or this one, holds "
                                         "the lock file " + quoted(p) + ")"
                                       : "cannot lock " + quoted(p) + ": " + std::strerror(e);
    return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(db_path) + ": " + why);
  }
  return {};
}

namespace {

int fine_busy_handler(void* arg, int count) {
  const auto timeout_us = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(arg)) * 1000;
  // What the earlier calls slept, by the same schedule.
  auto slept_before = [](std::int64_t n) -> std::int64_t {
    const std::int64_t a = std::min<std::int64_t>(n, 20), b = std::min<std::int64_t>(std::max<std::int64_t>(n - 20, 0), 80),
                       c = std::max<std::int64_t>(n - 100, 0);
    return a * 100 + b * 500 + c * 2000;
  };
  const std::int64_t step = count < 20 ? 100 : count < 100 ? 500 : 2000;
  if (slept_before(count) + step > timeout_us) return 0;
  std::this_thread::sleep_for(std::chrono::microseconds(step));
  return 1;
}

}  // namespace

void WriteTurns::take() {
  std::unique_lock lk(mu_);
  const std::uint64_t mine = issued_++;
  next_.wait(lk, [&] { return serving_ == mine; });
}

void WriteTurns::give_back() {
  {
    std::lock_guard lk(mu_);
    ++serving_;
  }
  next_.notify_all();
}

std::shared_ptr<WriteTurns> write_turns(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<WriteTurns>> files;  // guarded by mu
  std::string key = path;
  if (char* real = ::realpath(path.c_str(), nullptr)) {
    key = real;
    std::free(real);
  }
  std::lock_guard lk(mu);
  for (auto it = files.begin(); it != files.end();) it = it->second.expired() ? files.erase(it) : std::next(it);
  auto& slot = files[key];
  auto turns = slot.lock();
  if (!turns) {
    turns = std::make_shared<WriteTurns>();
    slot = turns;
  }
  return turns;
}

void fine_busy_timeout(sqlite3* db, int timeout_ms) {
  if (timeout_ms <= 0) {
    sqlite3_busy_handler(db, nullptr, nullptr);
    return;
  }
  sqlite3_busy_handler(db, fine_busy_handler, reinterpret_cast<void*>(static_cast<std::intptr_t>(timeout_ms)));
}

}  // namespace troupe::sqlite
