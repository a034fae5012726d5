// reminder_crash_child: delivers the due reminders of an SQLite reminder
// store on the real clock until killed.
//
//   reminder_crash_child <store path> <log path>
//
// Each delivery appends "<name>\n" to the log file (O_APPEND, one write()
// per line, so a SIGKILL leaves whole lines) 2 ms after it was handed over,
// and only then answers, so the service records the firing after the line
// is written and several deliveries are in flight at any time. The crash test in reminder_crash.test.cpp kills this process with
// SIGKILL mid-way and checks that a new service delivers everything the log
// does not show, and nothing more than what was in flight twice.
//
// Exit codes: 2 bad arguments, 3 the store or the service failed (message
// on stderr). It never exits on its own otherwise.

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "troupe/core.hpp"
#include "troupe/persist/reminder_service.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: reminder_crash_child <store path> <log path>\n");
    return 2;
  }
  auto store = troupe::open_sqlite_reminder_store({.path = argv[1], .full_sync = false});
  if (!store) {
    std::fprintf(stderr, "reminder_crash_child: %s\n", store.error().to_string().c_str());
    return 3;
  }
  const int log = ::open(argv[2], O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (log < 0) {
    std::perror("reminder_crash_child: open the log");
    return 3;
  }
  troupe::ActorSystem system;
  troupe::ReminderSettings s;
  s.max_per_second = 2000;
  s.burst = 20;
  s.page_size = 50;
  s.max_in_flight = 8;
  s.log = false;
  // The page it holds when killed stays claimed this long: short, so the
  // test's new service takes it again soon.
  s.attempt_timeout = std::chrono::seconds(1);
  s.lease = std::chrono::seconds(2);
  // A receiver that takes a little while: each delivery is answered from
  // this thread 2 ms after it was handed over, once its line is written,
  // so several are in flight when the kill lands.
  struct Pending {
    std::string name;
    std::shared_ptr<troupe::Promise<void>> done;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Pending> pending;
  std::thread receiver([&] {
    for (;;) {
      Pending p;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return !pending.empty(); });
        p = std::move(pending.front());
        pending.pop_front();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const std::string line = p.name + "\n";
      if (::write(log, line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
        p.done->set_value();
      } else {
        p.done->set_error(troupe::Error(troupe::ErrorCode::journal_failed, "cannot write the log"));
      }
    }
  });
  receiver.detach();
  auto service = troupe::ReminderService::start(system, *store, s, [&](const troupe::Reminder& r) {
    auto p = std::make_shared<troupe::Promise<void>>();
    auto f = p->future();
    {
      std::lock_guard lk(mu);
      pending.push_back(Pending{r.name, p});
    }
    cv.notify_one();
    return f;
  });
  if (!service) {
    std::fprintf(stderr, "reminder_crash_child: %s\n", service.error().to_string().c_str());
    return 3;
  }
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}
