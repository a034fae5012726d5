// A counter service on troupe: each counter is an event-sourced entity whose
// history is kept in a SQLite journal. The program adds to two counters,
// starts again on the same journal file to show the counts recovered from
// the stored events, and exits.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>

#include "troupe/core.hpp"
#include "troupe/persist.hpp"

namespace {

using namespace std::chrono_literals;

// Commands: what a counter is asked to do. Each answers with the count.
struct Add {
  std::int64_t amount = 0;
  troupe::ReplyTo<std::int64_t> reply_to;
};
struct Get {
  troupe::ReplyTo<std::int64_t> reply_to;
};
using CounterCommand = std::variant<Add, Get>;

// Events: what is stored, and replayed when a counter starts again.
struct Added {
  std::int64_t amount = 0;
};
using CounterEvent = std::variant<Added>;

struct Count {
  std::int64_t value = 0;
};

// The entity's behaviour: decide on a command, fold a stored event.
struct Counter {
  using Command = CounterCommand;
  using Event = CounterEvent;
  using State = Count;
  using Effect = troupe::Effect<Event, State>;

  Effect on_command(const State& s, Command& c, troupe::EntityContext<Counter>&) {
    return troupe::match(
        c,
        [&](Add& a) -> Effect {
          if (a.amount <= 0)
            return Effect::reject(a.reply_to, troupe::Error(troupe::ErrorCode::invalid_argument, "add a positive amount"));
          // Answered once the event is stored and applied.
          return Effect::persist(Added{a.amount}).then_reply(a.reply_to, [](const State& st) { return st.value; });
        },
        [&](Get& g) -> Effect { return Effect::reply(g.reply_to, s.value); });
  }

  void on_event(State& s, const Event& e) {
    troupe::match(e, [&](const Added& a) { s.value += a.amount; });
  }
};

// How events become bytes in the journal and back: a name, a version, and
// the two directions.
troupe::EventCodecs<CounterEvent> event_codecs() {
  troupe::EventCodecs<CounterEvent> codecs;
  codecs.add<Added>(
      "Added", 1, [](const Added& e, troupe::ByteWriter& w) { w.i64(e.amount); },
      [](std::uint32_t, troupe::ByteReader& r) { return r.finish(Added{r.i64()}); });
  return codecs;
}

// The counters of one journal file, in an actor system of their own. Owns
// both; destroying it stops the entities, then closes the journal. The
// calls block until the counter answers: make them from outside actors.
class Counters {
 public:
  static std::unique_ptr<Counters> open(const std::string& path) {
    auto journal = troupe::SqliteJournal::open({.path = path});
    if (!journal) return fail("cannot open the journal", journal.error());
    auto c = std::unique_ptr<Counters>(new Counters(*journal));
    auto registry = troupe::EntityRegistry<Counter>::start(c->system_, c->journal_, {.type_name = "counter"},
                                                           event_codecs());
    if (!registry) return fail("cannot start the counters", registry.error());
    c->registry_.emplace(*registry);
    return c;
  }

  void add(const char* id, std::int64_t amount) {
    auto count = registry_->ask<std::int64_t>(id, [&](auto reply) { return Add{amount, std::move(reply)}; }, 5s).get();
    if (count)
      std::printf("%s + %lld = %lld\n", id, static_cast<long long>(amount), static_cast<long long>(*count));
    else
      std::printf("%s + %lld refused: %s\n", id, static_cast<long long>(amount), count.error().message().c_str());
  }

  void print(const char* id) {
    auto count = registry_->ask<std::int64_t>(id, [](auto reply) { return Get{std::move(reply)}; }, 5s).get();
    if (count)
      std::printf("%s = %lld\n", id, static_cast<long long>(*count));
    else
      std::printf("%s: %s\n", id, count.error().message().c_str());
  }

 private:
  explicit Counters(std::shared_ptr<troupe::Journal> journal) : journal_(std::move(journal)) {}
  static std::unique_ptr<Counters> fail(const char* what, const troupe::Error& e) {
    std::fprintf(stderr, "%s: %s\n", what, e.message().c_str());
    return nullptr;
  }

  std::shared_ptr<troupe::Journal> journal_;
  troupe::ActorSystem system_;  // after the journal: stopped before the journal closes
  std::optional<troupe::EntityRegistry<Counter>> registry_;
};

}  // namespace

int main() {
  std::printf("troupe %s\n", std::string(troupe::version()).c_str());
  char dir[] = "/tmp/troupe-counter-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string journal = std::string(dir) + "/counters.db";

  bool ok = false;
  if (auto counters = Counters::open(journal)) {
    counters->add("apples", 3);
    counters->add("apples", 4);
    counters->add("pears", 10);
    counters->add("pears", -1);
    counters.reset();  // stops the entities and closes the journal

    std::printf("-- started again on the same journal --\n");
    if ((counters = Counters::open(journal))) {
      counters->print("apples");
      counters->add("pears", 2);
      ok = true;
    }
  }
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
