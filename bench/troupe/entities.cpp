// Entity workloads (troupe only; nothing comparable exists in the peers):
//   recovery       — ms to recover one entity with 10,000 events from SQLite
//                    (load, decode, fold, first reply), median of 3 entities;
//   entity_memory  — bytes per active entity and per passivated entity.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <variant>
#include <vector>

#include "common/report.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"

namespace troupe_bench {
namespace {

using namespace std::chrono_literals;

struct Deposit {
  std::int64_t amount = 0;
};
struct Touch {};
struct Balance {
  troupe::ReplyTo<std::int64_t> reply_to;
};
using AccountCmd = std::variant<Deposit, Touch, Balance>;
struct Deposited {
  std::int64_t amount = 0;
};

// A bank account: the smallest useful event-sourced entity.
struct Account {
  using Command = AccountCmd;
  using Event = Deposited;
  using State = std::int64_t;
  using Effect = troupe::Effect<Event, State>;

  Effect on_command(const State& s, Command& c, troupe::EntityContext<Account>&) {
    return troupe::match(
        c, [](Deposit& d) { return Effect::persist(Deposited{d.amount}); }, [](Touch&) { return Effect::none(); },
        [&](Balance& b) { return Effect::reply(b.reply_to, s); });
  }
  void on_event(State& s, const Event& e) { s += e.amount; }
};

troupe::EventCodecs<Deposited> codecs() {
  troupe::EventCodecs<Deposited> c;
  c.add<Deposited>(
      "Deposited", 1, [](const Deposited& e, troupe::ByteWriter& w) { w.i64(e.amount); },
      [](std::uint32_t, troupe::ByteReader& r) -> troupe::Result<Deposited> {
        Deposited d;
        d.amount = r.i64();
        return r.finish(d);
      });
  return c;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_troupe: %s\n", what.c_str());
  std::exit(1);
}

std::filesystem::path temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("troupe-bench-entities-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::shared_ptr<troupe::SqliteJournal> open_journal(const std::filesystem::path& file) {
  troupe::SqliteJournalOptions o;
  o.path = file.string();
  auto j = troupe::SqliteJournal::open(o);
  if (!j.ok()) die("cannot open journal: " + j.error().to_string());
  return std::move(*j);
}

}  // namespace

void recovery() {
  constexpr int kEntities = 3;
  const long events = 10'000 / bench::scale();
  auto dir = temp_dir();
  auto file = dir / "journal.db";
  {
    auto j = open_journal(file);
    troupe::ByteWriter w;
    w.i64(1);
    std::string payload = w.take();
    for (int e = 0; e < kEntities; ++e) {
      std::uint64_t seq = 0;
      while (static_cast<long>(seq) < events) {
        troupe::AppendBatch b;
        b.persistence_id = "account|a" + std::to_string(e);
        for (int i = 0; i < 1000 && static_cast<long>(seq) < events; ++i)
          b.events.push_back(troupe::EventRecord{++seq, 1'700'000'000'000, "Deposited", 1, payload});
        if (auto r = troupe::journal_sync::append(*j, std::move(b)); !r.ok()) die(r.error().to_string());
      }
    }
  }
  // A fresh journal and system: nothing of these entities is in memory.
  auto j = open_journal(file);
  troupe::SystemConfig cfg;
  cfg.threads = 2;
  troupe::ActorSystem sys(cfg);
  troupe::EntitySettings s;
  s.type_name = "account";
  auto reg = troupe::EntityRegistry<Account>::start(sys, j, s, codecs());
  if (!reg.ok()) die(reg.error().to_string());
  std::vector<double> ms;
  for (int e = 0; e < kEntities; ++e) {
    bench::Stopwatch sw;
    auto bal = reg->ask<std::int64_t>(
                      "a" + std::to_string(e), [](troupe::ReplyTo<std::int64_t> r) { return Balance{std::move(r)}; },
                      60s)
                   .get();
    ms.push_back(sw.seconds() * 1000.0);
    if (!bal.ok()) die("recovery failed: " + bal.error().to_string());
    if (*bal != events) die("recovered balance " + std::to_string(*bal) + ", expected " + std::to_string(events));
  }
  std::sort(ms.begin(), ms.end());
  bench::report("recovery", ms[ms.size() / 2], "ms");
  (void)reg->stop();
  sys.shutdown();
  j.reset();
  std::filesystem::remove_all(dir);
}

void entity_memory() {
  // Round 1 activates N entities: RSS growth / N = bytes per active entity.
  // Then rounds of N *other* ids are activated and passivated. The first
  // two let the allocators settle (memory freed on one worker thread is
  // reused from another only after a round trip through the pool's depot);
  // after that, a passivated entity that kept anything would grow RSS by
  // that much per round: growth over two more rounds / 2N = bytes per
  // passivated entity.
  const long n = 100'000 / bench::scale();
  auto clock = std::make_shared<troupe::ManualClock>();
  troupe::SystemConfig cfg;
  cfg.threads = 2;
  cfg.clock = clock;
  troupe::ActorSystem sys(cfg);
  auto journal = std::make_shared<troupe::MemoryJournal>();
  troupe::EntitySettings s;
  s.type_name = "account";
  s.idle_timeout = 60s;
  auto reg = troupe::EntityRegistry<Account>::start(sys, journal, s, codecs());
  if (!reg.ok()) die(reg.error().to_string());
  auto round = [&](char prefix) {
    for (long i = 0; i < n; ++i)
      if (!reg->tell(std::string(1, prefix) + std::to_string(i), Touch{}).ok()) die("tell refused");
    sys.wait_idle(600s);
    if (reg->stats().active != static_cast<std::uint64_t>(n)) die("not every entity is active");
  };
  auto passivate_all = [&] {
    clock->advance(s.idle_timeout);
    sys.wait_idle(600s);
    if (reg->stats().active != 0) die("entities still active after the idle timeout");
  };
  sys.wait_idle();
  long before = bench::proc_status_kb("VmRSS");
  round('a');
  long active = bench::proc_status_kb("VmRSS");
  passivate_all();
  round('b');
  passivate_all();
  round('c');
  passivate_all();
  long settled = bench::proc_status_kb("VmRSS");
  round('d');
  passivate_all();
  round('e');
  passivate_all();
  long after = bench::proc_status_kb("VmRSS");
  double per_active = static_cast<double>(active - before) * 1024.0 / static_cast<double>(n);
  double per_passive = std::max(0.0, static_cast<double>(after - settled) * 1024.0 / static_cast<double>(2 * n));
  bench::report("entity_memory_active", per_active, "bytes/entity");
  bench::report("entity_memory_passivated", per_passive, "bytes/entity");
  (void)reg->stop(1s);
}

}  // namespace troupe_bench
