#pragma once
// Helpers shared by the journal tests: a private temp directory,
// ready-made events and batches, and the names the tests use unqualified.

#include <stdlib.h>  // mkdtemp

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "troupe/persist/journal.hpp"

namespace troupe::test {

// A directory of its own under the system temp dir, removed with everything
// in it when the test ends (even if a test made it read-only).
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-journal-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Event `seq`, with `payload` or a default one naming it.
inline EventRecord event(std::uint64_t seq, std::string payload = {}) {
  EventRecord e;
  e.seq = seq;
  e.timestamp_ms = 1'700'000'000'000 + static_cast<std::int64_t>(seq);
  e.type = "test.Event";
  e.version = 1;
  e.payload = payload.empty() ? "event " + std::to_string(seq) : std::move(payload);
  return e;
}

// Events first..last (inclusive) for `id`, as one batch.
inline AppendBatch batch(const std::string& id, std::uint64_t first, std::uint64_t last) {
  AppendBatch b;
  b.persistence_id = id;
  for (std::uint64_t s = first; s <= last; ++s) b.events.push_back(event(s));
  return b;
}

inline std::vector<std::uint64_t> seqs(const std::vector<EventRecord>& events) {
  std::vector<std::uint64_t> out;
  for (const auto& e : events) out.push_back(e.seq);
  return out;
}

inline std::vector<std::uint64_t> range(std::uint64_t first, std::uint64_t last) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t s = first; s <= last; ++s) out.push_back(s);
  return out;
}

// The journal's vocabulary for the tests of its back ends, in one
// directive: `using namespace troupe::test::journal_names;`.
namespace journal_names {
using troupe::AppendBatch;
using troupe::ErrorCode;
using troupe::EventRecord;
using troupe::Journal;
using troupe::Recovery;
using troupe::Result;
using troupe::SnapshotRecord;
namespace js = troupe::journal_sync;
using troupe::test::batch;
using troupe::test::event;
using troupe::test::range;
using troupe::test::seqs;
using troupe::test::TempDir;
}  // namespace journal_names

}  // namespace troupe::test
