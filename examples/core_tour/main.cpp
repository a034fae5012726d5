// A short tour of troupe's actor core: typed actors, a state machine written
// with become(), keyed timers, ask, watch and supervision. It prints what
// happens as it happens, then the system's counters.
//
// Run it with ./scripts/demo (see README.md).

#include <atomic>
#include <cstdio>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>

#include "troupe/core.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::Actor;
using troupe::ActorRef;
using troupe::ReplyTo;

std::mutex print_mu;
auto t0 = std::chrono::steady_clock::now();

template <class... A>
void say(const char* who, const char* fmt, A... a) {
  std::lock_guard lk(print_mu);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[%5lld ms] %-10s ", static_cast<long long>(ms), who);
  if constexpr (sizeof...(A) == 0) {
    std::fputs(fmt, stdout);
  } else {
    std::printf(fmt, a...);
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// --- 1. a state machine: a turnstile that takes coins -----------------------

struct Coin {};
struct Push {};
struct AutoLock {};  // a timer fires this if nobody walks through
struct Status {
  ReplyTo<std::string> reply;
};
using TurnstileMsg = std::variant<Coin, Push, AutoLock, Status>;

struct Turnstile : Actor<TurnstileMsg> {
  int passed = 0;

  void receive(TurnstileMsg& m) { locked(m); }  // starts locked

  void locked(TurnstileMsg& m) {
    troupe::match(
        m,
        [&](Coin&) {
          say("turnstile", "coin accepted: unlocked (relocks in 300 ms unless someone passes)");
          start_timer("relock", 300ms, AutoLock{});
          become(&Turnstile::unlocked);
        },
        [&](Push&) { say("turnstile", "push while locked: nothing happens"); },
        [&](AutoLock&) { say("turnstile", "BUG: a cancelled relock fired"); },
        [&](Status& s) { s.reply("locked, " + std::to_string(passed) + " passed"); });
  }

  void unlocked(TurnstileMsg& m) {
    troupe::match(
        m,
        [&](Coin&) { say("turnstile", "coin while unlocked: thanks, still unlocked"); },
        [&](Push&) {
          ++passed;
          cancel_timer("relock");  // the pending relock can never arrive now
          say("turnstile", "someone passed (%d so far): locked again", passed);
          become(&Turnstile::locked);
        },
        [&](AutoLock&) {
          say("turnstile", "nobody came: the relock timer locked it");
          become(&Turnstile::locked);
        },
        [&](Status& s) { s.reply("unlocked, " + std::to_string(passed) + " passed"); });
  }
};

// --- 2. supervision: a flaky worker restarted with back-off -----------------

struct Job {
  int n;
};

struct FlakyWorker : Actor<Job> {
  int handled = 0;  // fresh after every restart
  void on_start() { say("worker", "started (fresh state)"); }
  void receive(Job& j) {
    if (j.n % 3 == 0) throw std::runtime_error("job " + std::to_string(j.n) + " is cursed");
    ++handled;
    say("worker", "job %d done (%d handled by this incarnation)", j.n, handled);
  }
};

// --- 3. watch: a supervisor hears when a worker stops -----------------------

struct Watch {
  ActorRef<Job> target;
};
using MonitorMsg = std::variant<Watch, troupe::Down>;

struct Monitor : Actor<MonitorMsg> {
  explicit Monitor(std::promise<void>* d) : down(d) {}
  std::promise<void>* down;
  void receive(MonitorMsg& m) {
    troupe::match(
        m,
        [&](Watch& w) {
          say("monitor", "watching '%s'", w.target.name().c_str());
          watch(w.target);
        },
        [&](troupe::Down& d) {
          say("monitor", "'%s' terminated: %s (%s)", d.actor.name().c_str(),
              std::string(troupe::to_string(d.reason)).c_str(), d.detail.c_str());
          down->set_value();
        });
  }
};

// --- 4. ask from inside an actor, with a timeout ----------------------------

struct Quote {
  ReplyTo<int> reply;
  std::string item;
};

struct PriceList : Actor<Quote> {
  void receive(Quote& q) {
    if (q.item == "teapot") return;  // never answers: the ReplyTo is dropped
    q.reply(static_cast<int>(q.item.size()) * 100);
  }
};

struct Shop {};
struct Shopper : Actor<Shop> {
  Shopper(ActorRef<Quote> p, std::promise<void>* d) : prices(std::move(p)), done(d) {}
  ActorRef<Quote> prices;
  std::promise<void>* done;
  int answers = 0;
  void receive(Shop&) {
    for (std::string item : {"bread", "teapot"}) {
      ask<int>(
          prices, [item](ReplyTo<int> r) { return Quote{std::move(r), item}; }, 200ms,
          [this, item](troupe::Result<int> r) {
            if (r) {
              say("shopper", "%s costs %d", item.c_str(), *r);
            } else {
              say("shopper", "no price for %s: %s", item.c_str(), r.error().to_string().c_str());
            }
            if (++answers == 2) done->set_value();
          });
    }
  }
};

}  // namespace

int main() {
  std::printf("troupe core tour: actors, become, timers, ask, watch, supervision\n\n");
  troupe::SystemConfig cfg;
  cfg.log_failures = false;  // the tour prints failures itself, via watch
  cfg.log_dead_letters = false;
  troupe::ActorSystem system(cfg);

  // 1. state machine + timers
  auto gate = system.spawn<Turnstile>(troupe::SpawnOptions{.name = "turnstile"});
  gate.tell(Push{});
  gate.tell(Coin{});
  gate.tell(Push{});
  gate.tell(Coin{});
  std::this_thread::sleep_for(450ms);  // let the relock timer fire
  auto status = system.ask<std::string>(gate, [](ReplyTo<std::string> r) { return Status{std::move(r)}; }, 1s);
  say("main", "asked the turnstile: %s", status.get().value().c_str());

  // 2 + 3. supervision and watch
  std::promise<void> worker_down;
  auto monitor = system.spawn<Monitor>(troupe::SpawnOptions{.name = "monitor"}, &worker_down);
  troupe::RestartPolicy policy;
  policy.min_backoff = 50ms;
  policy.max_restarts = 2;
  policy.within = 10s;
  auto worker = system.spawn<FlakyWorker>(
      troupe::SpawnOptions{.name = "worker", .supervision = troupe::Supervision::restart(policy)});
  monitor.tell(Watch{worker});
  system.wait_idle();
  for (int n = 1; n <= 10; ++n) worker.tell(Job{n});
  worker_down.get_future().wait();
  say("main", "after the worker stopped, a job to it is a %s",
      std::string(troupe::to_string(worker.tell(Job{11}))).c_str());

  // 4. ask with continuation inside an actor
  std::promise<void> shopped;
  auto prices = system.spawn<PriceList>(troupe::SpawnOptions{.name = "prices"});
  auto shopper = system.spawn<Shopper>(troupe::SpawnOptions{.name = "shopper"}, prices, &shopped);
  shopper.tell(Shop{});
  shopped.get_future().wait();

  system.wait_idle();
  auto st = system.stats();
  std::printf(
      "\nstats: %llu actors spawned, %llu live, %llu handler failures, %llu restarts, "
      "%llu dead letters, %llu stale timer fires dropped\n",
      static_cast<unsigned long long>(st.actors_spawned), static_cast<unsigned long long>(st.actors_live),
      static_cast<unsigned long long>(st.handler_failures), static_cast<unsigned long long>(st.restarts),
      static_cast<unsigned long long>(st.dead_letters), static_cast<unsigned long long>(st.stale_timer_fires));
  system.shutdown();
  std::printf("shut down cleanly\n");
  return 0;
}
