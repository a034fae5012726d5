#pragma once
// Announcer: how PostgreSQL journals in different processes tell each other
// that events were stored (event_query.hpp "Live"). Internal to
// src/persist/postgres; doc/journal.md ("Global order") describes it.
//
// One connection and one thread per journal. The connection LISTENs on the
// schema's channel. After a writer lane's commit stored events, announce()
// marks an announcement due and wakes the thread, which sends NOTIFY in a
// statement of its own: never inside an append's transaction (a NOTIFY
// there would serialise the lanes' commits), at most one per commit (those
// that come while one is being sent go together in the next). A
// notification from another backend (another journal object, usually
// another process) calls `heard`; the thread's own are ignored. A lost
// connection is made again with back-off, and `heard` is called once it is
// back, since announcements may have been missed meanwhile.
//
// Thread-safe: announce() from any thread; start() and stop() from the
// owner. `heard` runs on the announcer's thread and must not block.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "troupe/core/result.hpp"

namespace troupe::pg {

struct Shared;

class Announcer {
 public:
  // `channel`: a quoted identifier. `shared` outlives the thread (the thread
  // holds start()'s keep_alive, which owns it).
  Announcer(const Shared& shared, std::string channel, std::function<void()> heard);
  ~Announcer();
  Announcer(const Announcer&) = delete;
  Announcer& operator=(const Announcer&) = delete;

  // Connects and LISTENs: journal_failed when that fails. Once.
  Result<void> open();
  // Starts the thread, which holds `keep_alive` until it ends. After open().
  void start(std::shared_ptr<void> keep_alive);
  // A commit stored events: announce it. Cheap; never blocks.
  void announce() noexcept;
  // Ends the thread: joins it, or detaches it when called on it.
  void stop();

 private:
  struct State;
  void run(std::shared_ptr<void> keep_alive);

  std::unique_ptr<State> state_;
  std::thread thread_;
};

}  // namespace troupe::pg
