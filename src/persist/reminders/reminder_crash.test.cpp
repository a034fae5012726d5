// A reminder service in a process killed with SIGKILL mid-delivery (SPEC
// R2, V2): a child (reminder_crash_child_main.cpp) delivers the reminders
// of an SQLite store, logging each, and is killed part-way; a new service
// here on the same file delivers the rest (the page the child had claimed
// once its 2 s lease lapsed). Every reminder is delivered, and
// the only ones delivered twice are those the child had delivered and not
// yet recorded (at most its in-flight limit).

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "../journal_test_support.hpp"
#include "troupe/core.hpp"
#include "troupe/persist/reminder_service.hpp"

#ifdef TROUPE_REMINDER_CRASH_CHILD

namespace {

using namespace std::chrono_literals;

std::size_t lines_in(const std::string& path) {
  std::ifstream in(path);
  std::size_t n = 0;
  for (std::string l; std::getline(in, l);) ++n;
  return n;
}

// proves: R2, V2
TEST(ReminderCrash, a_service_killed_with_sigkill_mid_delivery_loses_nothing_and_repeats_only_what_was_in_flight) {
  constexpr int kCount = 3000;
  troupe::test::TempDir dir;
  const std::string db = dir.file("reminders.db"), log = dir.file("delivered.log");
  const std::int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  {
    auto store = troupe::open_sqlite_reminder_store({.path = db, .full_sync = false});
    ASSERT_TRUE(store.ok()) << store.error().to_string();
    for (int i = 0; i < kCount; ++i)
      ASSERT_TRUE((*store)->set({"o" + std::to_string(i % 10), "r" + std::to_string(i), now_ms - 1000 + i % 500, 0, {}})
                      .ok());
  }
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execl(TROUPE_REMINDER_CRASH_CHILD, TROUPE_REMINDER_CRASH_CHILD, db.c_str(), log.c_str(), nullptr);
    _exit(127);
  }
  // Killed about a third of the way (2,000 a second: about half a second in).
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  while (lines_in(log) < kCount / 3 && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited on its own: " << status;

  std::map<std::string, int> delivered;
  {
    std::ifstream in(log);
    for (std::string l; std::getline(in, l);) ++delivered[l];
  }
  const std::size_t before = delivered.size();
  ASSERT_GE(before, static_cast<std::size_t>(kCount / 3));
  ASSERT_LT(before, static_cast<std::size_t>(kCount)) << "the child finished before it was killed";

  auto store = troupe::open_sqlite_reminder_store({.path = db, .full_sync = false});
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  troupe::ActorSystem system;
  troupe::ReminderSettings s;
  s.max_per_second = 100'000;
  s.log = false;
  std::mutex mu;
  auto service = troupe::ReminderService::start(system, *store, s, [&](const troupe::Reminder& r) {
    {
      std::lock_guard lk(mu);
      ++delivered[r.name];
    }
    troupe::Promise<void> p;
    auto f = p.future();
    p.set_value();
    return f;
  });
  ASSERT_TRUE(service.ok());
  // Until the store is empty: the page the child had claimed comes only
  // once its lease lapsed.
  auto left = [&] {
    auto sum = (*store)->summary(now_ms);
    return !sum.ok() || sum->next_try_ms.has_value();
  };
  while (left() && std::chrono::steady_clock::now() < give_up + 30s) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(system.wait_idle(10s));
  service->stop();
  std::lock_guard lk(mu);
  int twice = 0;
  for (int i = 0; i < kCount; ++i) {
    const int n = delivered["r" + std::to_string(i)];
    ASSERT_GE(n, 1) << "r" << i << " was lost";
    ASSERT_LE(n, 2) << "r" << i;
    twice += n - 1;
  }
  EXPECT_LE(twice, 8) << "only what was in flight at the kill is delivered again";
  EXPECT_FALSE((*store)->summary(now_ms + 10'000)->next_try_ms.has_value()) << "every reminder fired and deleted";
}

}  // namespace

#endif
