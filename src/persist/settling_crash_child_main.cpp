// settling_crash_child: puts one payment into its settling episode on an
// SQLite journal and stays there until killed.
//
//   settling_crash_child <db path> <entity id> <amount>
//
// Runs the test payment entity (entity_test_support.hpp) with a gateway
// that keeps every request and never answers. Once the entity has answered
// "accepted <amount>" (so Accepted is stored) and its request has reached
// the gateway, it writes "settling <entity id>\n" to stdout and waits to be
// killed: the SIGKILL lands mid-episode, with the deadline armed in this
// process only. The E1 crash test in entity.test.cpp recovers the payment
// from the file.
//
// Exit codes: 2 bad arguments, 3 the journal, the registry or the payment
// failed (message on stderr). It never exits on its own otherwise.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "entity_test_support.hpp"
#include "troupe/persist/sqlite_journal.hpp"
#include "troupe/testkit/gate.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::test;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "settling_crash_child: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

// Keeps each request (so its ask stays open) and opens `reached`.
class SilentGateway final : public Actor<GatewayRequest> {
 public:
  explicit SilentGateway(std::shared_ptr<testkit::Gate> reached) : reached_(std::move(reached)) {}
  void receive(GatewayRequest& r) {
    kept_.push_back(std::move(r));
    reached_->open();
  }

 private:
  std::shared_ptr<testkit::Gate> reached_;
  std::vector<GatewayRequest> kept_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <db path> <entity id> <amount>\n", argv[0]);
    return 2;
  }
  std::string id = argv[2];
  std::int64_t amount = std::atoll(argv[3]);
  SqliteJournalOptions options;
  options.path = argv[1];
  options.durability = Durability::full;
  auto journal = SqliteJournal::open(options);
  if (!journal.ok()) die(journal.error().to_string());
  ActorSystem system(SystemConfig{.threads = 2, .log_dead_letters = false, .log_failures = false});
  auto reached = std::make_shared<testkit::Gate>();
  auto gateway = system.spawn<SilentGateway>(reached);
  EntitySettings settings;
  settings.type_name = "pay";
  settings.log = false;
  auto reg = EntityRegistry<Pay>::start(system, *journal, settings, pay_codecs(),
                                        [gateway](const std::string&) { return Pay{gateway}; });
  if (!reg.ok()) die(reg.error().to_string());
  auto r = reg->ask<std::string>(id, [amount](ReplyTo<std::string> t) { return Settle{amount, std::move(t)}; }, 30s)
               .get();
  if (!r.ok()) die("settle failed: " + r.error().to_string());
  if (*r != "accepted " + std::to_string(amount)) die("unexpected answer: " + *r);
  if (!reached->wait(30s)) die("the gateway got no request");
  std::string line = "settling " + id + "\n";
  if (::write(STDOUT_FILENO, line.data(), line.size()) != static_cast<ssize_t>(line.size())) die("stdout closed");
  for (;;) ::pause();  // the test kills us
}
