// One cluster node for the multi-process tests (cluster_process.test.cpp):
// an actor system, the PostgreSQL journal, the Redis coordinator, remoting
// and a shard region of accounts whose every stored deposit is also written
// to a history file as "<entity> <node> <incarnation> <seq> <amount>", and
// whose every incarnation writes "start ..." and "stop ..." lines to an
// activation log, so a checker can prove after the run that no two
// incarnations of one entity were ever active together and that nothing
// acknowledged was lost (SPEC V1, history_checker.hpp).
//
//   cluster_test_node --id n1 --redis-port P --postgres CONNINFO --schema S
//                     --history FILE [--activations FILE] [--shards N]
//                     [--heartbeat-ms 200] [--threshold-ms 1000]
//                     [--margin-ms 300] [--settle-ms 30000]
//
// Prints "READY <port>" once registered. A control actor, published as
// "ctl", takes requests from the test driver (deposit / where / stats).
// SIGTERM: a graceful leave (shards handed off), then exit 0.
//
// Built a second time as cluster_test_node_unfenced with
// TROUPE_TEST_UNFENCED=1: a node without the guards of E7/E9, for the test
// that shows the checker sees two live incarnations. Its journal stores
// every append without its fence and raises no fence, and its region
// ignores the immediate stops that self-fencing asks for. Test-only: the
// library has no such switch.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <variant>

#include "cluster_test_protocol.hpp"
#include "history_checker.hpp"
#include "troupe/cluster/cluster.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"
#include "troupe/persist/postgres_journal.hpp"

namespace {

using namespace troupe;
using namespace troupe::cluster;
using namespace troupe::cluster::proc;

std::atomic<bool> g_term{false};
void on_term(int) { g_term.store(true); }

// The history file: one line per stored deposit, flushed at once (a kill -9
// must not lose lines of acknowledged events; write(2) to an O_APPEND file
// is enough for that, the page cache outlives the process).
class History {
 public:
  explicit History(const std::string& path) : f_(std::fopen(path.c_str(), "a")) {
    if (!f_) {
      std::fprintf(stderr, "cannot open history file %s: %s\n", path.c_str(), std::strerror(errno));
      std::exit(2);
    }
    std::setvbuf(f_, nullptr, _IONBF, 0);
  }
  void add(const std::string& line) {
    std::lock_guard lk(mu_);
    std::fputs(line.c_str(), f_);
  }

 private:
  std::mutex mu_;
  std::FILE* f_;
};

// The activation log (SPEC V1): a line when an incarnation of an entity
// starts, "start <entity> <node> <pid> <incarnation> <wall us>", and one when
// it ends, "stop ...". A process killed with SIGKILL writes no stop line;
// the checker ends its activations at the kill.
inline std::string activation_line(const char* kind, const std::string& entity, const std::string& node,
                                   std::uint64_t incarnation) {
  return std::string(kind) + " " + entity + " " + node + " " + std::to_string(getpid()) + " " +
         std::to_string(incarnation) + " " + std::to_string(wall_now_us()) + "\n";
}

// One incarnation's lines in the activation log: "start" when the token is
// made (the factory, as the registry builds the incarnation's behaviour
// object), "stop" when the last behaviour object holding it is destroyed.
// The actor runtime destroys an actor's object in the stop hook that runs
// its on_stop, right after on_stop told the shard that the entity is down
// (CellImpl::on_stop_hook in troupe/core/actor.hpp), on every way an
// incarnation ends (passivation, a refused append, a hand-off, a fence).
// Another node can start the entity only after that shard handled the
// message, its registry reported the shard stopped, released() went to
// the directory and the release went through Redis: the stop line comes
// first by far more than the microseconds between on_stop and the
// destructor. Owned by the behaviour object (shared, as it is moved); the
// log it writes to outlives every entity. Thread-safe as the log is.
class ActivationToken {
 public:
  ActivationToken(History* log, std::string entity, std::string node, std::uint64_t incarnation)
      : log_(log), entity_(std::move(entity)), node_(std::move(node)), incarnation_(incarnation) {
    if (log_) log_->add(activation_line("start", entity_, node_, incarnation_));
  }
  ~ActivationToken() {
    if (log_) log_->add(activation_line("stop", entity_, node_, incarnation_));
  }
  ActivationToken(const ActivationToken&) = delete;
  ActivationToken& operator=(const ActivationToken&) = delete;

 private:
  History* log_;
  std::string entity_, node_;
  std::uint64_t incarnation_;
};

#if TROUPE_TEST_UNFENCED
// The journal without fences: appends are stored without their writer's
// fence and raise_fence stores nothing, so a stale owner's appends are
// refused by nothing but the primary key. Shares the inner journal;
// thread-safe as the inner journal is.
class UnfencedJournal final : public ForwardingJournal {
 public:
  using ForwardingJournal::ForwardingJournal;
  void append(AppendBatch batch, Callback<void> done) override {
    batch.fence = Fence{};
    inner().append(std::move(batch), std::move(done));
  }
  void raise_fence(std::string, std::uint64_t, Callback<void> done) override { done(Result<void>{}); }
  std::string_view name() const noexcept override { return "unfenced"; }
};

// The cluster's directory, less self-fencing: the immediate stops a node
// that lost its lease asks of its shards are dropped, so its entities live
// on after a takeover. Hand-offs (graceful stops) go through. Refers to the
// cluster's directory, which outlives it; thread-safe as that one is.
class UnfencedDirectory final : public ShardDirectory {
 public:
  explicit UnfencedDirectory(ShardDirectory& inner) : inner_(inner) {}
  const std::string& self() const override { return inner_.self(); }
  Result<void> attach(const std::string& type, std::uint32_t shard_count, Host host) override {
    auto stop = std::move(host.stop);
    host.stop = [stop](std::uint32_t shard, std::uint64_t epoch, bool immediate) {
      if (!immediate) stop(shard, epoch, immediate);
    };
    return inner_.attach(type, shard_count, std::move(host));
  }
  void detach(const std::string& type) override { inner_.detach(type); }
  void locate(const std::string& type, std::uint32_t shard, Located done) override {
    inner_.locate(type, shard, std::move(done));
  }
  void released(const std::string& type, std::uint32_t shard, std::uint64_t epoch) override {
    inner_.released(type, shard, epoch);
  }

 private:
  ShardDirectory& inner_;
};
#endif

struct Ledger {
  using Command = LedgerCmd;
  using Event = LedgerEvent;
  using State = LedgerState;
  using Effect = troupe::Effect<Event, State>;

  std::string node;
  std::uint64_t incarnation = 0;
  History* history = nullptr;
  Duration settle_timeout{};
  std::string hold_marker;  // written with the entity's id when a Deposit holds
  std::shared_ptr<ActivationToken> activation;  // this incarnation's lines in the activation log

  Effect on_command(const State& s, Command& c, EntityContext<Ledger>& ctx) {
    return std::visit(
        [&](auto& m) -> Effect {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, Deposit>) {
            if (m.hold_ms > 0) {
              // Blocks this worker on purpose: the test freezes the node
              // while this command is between its decision and its append.
              std::ofstream(hold_marker, std::ios::trunc) << ctx.id() << "\n" << std::flush;
              std::this_thread::sleep_for(std::chrono::milliseconds(m.hold_ms));
            }
            std::int64_t amount = m.amount;
            return Effect::persist(Deposited{amount})
                .then([this, &ctx, amount] {
                  history->add(ctx.id() + " " + node + " " + std::to_string(incarnation) + " " +
                               std::to_string(ctx.last_seq()) + " " + std::to_string(amount) + "\n");
                })
                .then_reply(m.reply_to, [](const State& st) { return st.balance; });
          } else if constexpr (std::is_same_v<T, Where>) {
            return Effect::reply(m.reply_to, node + " " + std::to_string(s.balance) + (s.settling ? " settling" : ""));
          } else if constexpr (std::is_same_v<T, StartSettle>) {
            if (s.settling) return Effect::reply(m.reply_to, std::string("settling"));
            return Effect::persist(SettleStarted{}).then_reply(m.reply_to, [] { return std::string("settling"); });
          } else if constexpr (std::is_same_v<T, Credit>) {
            // A repeat (re-sent after a failover) answers what the op left.
            if (auto done = s.credits.find(m.op); done != s.credits.end()) return Effect::reply(m.reply_to, done->second);
            std::int64_t amount = m.amount;
            std::string op = m.op;
            return Effect::persist(Credited{op, amount})
                .then([this, &ctx, amount, op] {
                  history->add(ctx.id() + " " + node + " " + std::to_string(incarnation) + " " +
                               std::to_string(ctx.last_seq()) + " " + std::to_string(amount) + " " + op + "\n");
                })
                .then_reply(m.reply_to, [op](const State& st) { return st.credits.at(op); });
          } else {
            if (!s.settling) return Effect::none();
            return Effect::persist(SettleEnded{});
          }
        },
        c);
  }
  void on_event(State& s, const Event& e) {
    std::visit(
        [&](const auto& ev) {
          using T = std::decay_t<decltype(ev)>;
          if constexpr (std::is_same_v<T, Deposited>) {
            s.balance += ev.amount;
          } else if constexpr (std::is_same_v<T, Credited>) {
            s.balance += ev.amount;
            s.credits[ev.op] = s.balance;
          } else if constexpr (std::is_same_v<T, SettleStarted>) {
            s.settling = true;
          } else {
            s.settling = false;
          }
        },
        e);
  }
  std::optional<Processing<Event>> processing(const State& s) const {
    if (!s.settling) return std::nullopt;
    return Processing<Event>{settle_timeout, SettleEnded{}};
  }
};

// A continuation that answers `rt` with the region's answer, as it is.
template <class R>
auto forward_to(ReplyTo<R> rt) {
  return [rt = std::move(rt)](Result<R> r) mutable {
    if (r.ok()) {
      rt.reply(std::move(r.value()));
    } else {
      rt.fail(std::move(r).error());
    }
  };
}

// The driver's requests, answered through this node's region.
struct Ctl : Actor<CtlMsg> {
  Ctl(ShardRegion<Ledger> r, Cluster* c) : region(std::move(r)), cluster(c) {}
  ShardRegion<Ledger> region;
  Cluster* cluster;
  void receive(CtlMsg& m) {
    std::visit(
        [&](auto& req) {
          using T = std::decay_t<decltype(req)>;
          if constexpr (std::is_same_v<T, CtlDeposit>) {
            region.ask<std::int64_t>(
                      req.entity,
                      [a = req.amount, h = req.hold_ms](ReplyTo<std::int64_t> r) { return Deposit{a, std::move(r), h}; },
                      std::chrono::seconds(20))
                .then(forward_to(std::move(req.reply_to)));
          } else if constexpr (std::is_same_v<T, CtlWhere>) {
            region.ask<std::string>(req.entity, [](ReplyTo<std::string> r) { return Where{std::move(r)}; }, std::chrono::seconds(20))
                .then(forward_to(std::move(req.reply_to)));
          } else if constexpr (std::is_same_v<T, CtlSettle>) {
            region.ask<std::string>(req.entity, [](ReplyTo<std::string> r) { return StartSettle{std::move(r)}; }, std::chrono::seconds(20))
                .then(forward_to(std::move(req.reply_to)));
          } else if constexpr (std::is_same_v<T, CtlCredit>) {
            region.ask<std::int64_t>(
                      req.entity,
                      [op = req.op, a = req.amount](ReplyTo<std::int64_t> r) { return Credit{op, a, std::move(r)}; },
                      std::chrono::seconds(20))
                .then(forward_to(std::move(req.reply_to)));
          } else if constexpr (std::is_same_v<T, CtlRebalance>) {
            cluster->coordinator().rebalance_all(troupe::cluster::detail::shard_group(kLedgerType))
                .then([rt = std::move(req.reply_to)](Result<std::vector<Move>> r) mutable {
                  if (r.ok()) {
                    rt.reply(static_cast<std::int64_t>(r.value().size()));
                  } else {
                    rt.fail(std::move(r).error());
                  }
                });
          } else if constexpr (std::is_same_v<T, CtlStats>) {
            auto st = region.stats();
            req.reply_to.reply("hosted=" + std::to_string(st.shards_hosted) + " active=" + std::to_string(st.entities.active) +
                               " fenced=" + std::to_string(cluster->coordinator().is_fenced() ? 1 : 0) +
                               " members=" + std::to_string(cluster->coordinator().members().size()) +
                               " resent=" + std::to_string(st.resent));
          }
        },
        m);
  }
};

std::string arg(int argc, char** argv, const char* name, const char* fallback = nullptr) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  if (!fallback) {
    std::fprintf(stderr, "cluster_test_node: missing %s\n", name);
    std::exit(2);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  std::string id = arg(argc, argv, "--id");
  int redis_port = std::atoi(arg(argc, argv, "--redis-port").c_str());
  std::string conninfo = arg(argc, argv, "--postgres");
  std::string schema = arg(argc, argv, "--schema");
  const std::string history_path = arg(argc, argv, "--history");
  History history(history_path);
  const std::string activations_path = arg(argc, argv, "--activations", "");
  std::unique_ptr<History> activations;
  if (!activations_path.empty()) activations = std::make_unique<History>(activations_path);
  std::uint32_t shards = static_cast<std::uint32_t>(std::atoi(arg(argc, argv, "--shards", "30").c_str()));
  auto ms = [&](const char* name, const char* d) { return std::chrono::milliseconds(std::atoi(arg(argc, argv, name, d).c_str())); };

  struct sigaction sa {};
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  SystemConfig cfg;
  cfg.threads = 2;
  cfg.log_dead_letters = false;
  ActorSystem system(std::move(cfg));

  PostgresJournalOptions jo;
  jo.conninfo = conninfo;
  jo.schema = schema;
  auto journal = PostgresJournal::open(jo);
  if (!journal.ok()) {
    std::fprintf(stderr, "cluster_test_node %s: journal: %s\n", id.c_str(), journal.error().to_string().c_str());
    return 1;
  }

  ClusterSettings cs;
  cs.node_id = id;
  cs.security.insecure = true;  // one machine
  cs.coordination.redis_port = static_cast<std::uint16_t>(redis_port);
  cs.coordination.key_prefix = "proc-test";
  // Timings not given stay at the library's defaults (the failover bench
  // measures those).
  auto timing = [&](const char* name, Duration& d) {
    std::string v = arg(argc, argv, name, "");
    if (!v.empty()) d = std::chrono::milliseconds(std::atoi(v.c_str()));
  };
  timing("--heartbeat-ms", cs.coordination.heartbeat_interval);
  timing("--threshold-ms", cs.coordination.liveness_threshold);
  timing("--margin-ms", cs.coordination.takeover_margin);
  timing("--sync-ms", cs.coordination.sync_interval);
  timing("--command-timeout-ms", cs.coordination.command_timeout);
  cs.coordination.epoch_floor = [j = journal.value()] {
    auto h = troupe::journal_sync::highest_fence(*j);
    return h.ok() ? *h : 0;
  };
  auto cluster = Cluster::start(system, cs);
  if (!cluster.ok()) {
    std::fprintf(stderr, "cluster_test_node %s: %s\n", id.c_str(), cluster.error().to_string().c_str());
    return 1;
  }

  ShardRegionSettings rs;
  rs.entity.type_name = kLedgerType;
  rs.entity.idle_timeout = Duration::zero();
  rs.entity.stash_capacity = 10'000;
  rs.entity.stop_timeout = std::chrono::seconds(30);
  rs.shard_count = shards;
  Duration settle = ms("--settle-ms", "30000");
  std::atomic<std::uint64_t> incarnations{0};
#if TROUPE_TEST_UNFENCED
  std::shared_ptr<Journal> entity_journal = std::make_shared<UnfencedJournal>(journal.value());
  UnfencedDirectory unfenced_directory(cluster.value()->directory());
  ShardDirectory& directory = unfenced_directory;
#else
  std::shared_ptr<Journal> entity_journal = journal.value();
  ShardDirectory& directory = cluster.value()->directory();
#endif
  auto region = ShardRegion<Ledger>::start(
      system, entity_journal, cluster.value()->remoting(), directory, rs, ledger_events(), ledger_commands(),
      [&](const std::string& entity) {
        std::uint64_t incarnation = (static_cast<std::uint64_t>(getpid()) << 32) | ++incarnations;
        return Ledger{id,
                      incarnation,
                      &history,
                      settle,
                      history_path + ".holding",
                      std::make_shared<ActivationToken>(activations.get(), entity, id, incarnation)};
      });
  if (!region.ok()) {
    std::fprintf(stderr, "cluster_test_node %s: region: %s\n", id.c_str(), region.error().to_string().c_str());
    return 1;
  }
  auto ctl = system.spawn<Ctl>(region.value(), cluster.value().get());
  (void)cluster.value()->remoting().publish<CtlMsg>("ctl", ctl, ctl_codecs());

  std::printf("READY %u\n", static_cast<unsigned>(cluster.value()->remoting().port()));
  std::fflush(stdout);

  while (!g_term.load()) usleep(20'000);

  auto left = cluster.value()->leave(std::chrono::seconds(60));
  if (!left.ok()) std::fprintf(stderr, "cluster_test_node %s: leave: %s\n", id.c_str(), left.error().to_string().c_str());
  (void)region.value().stop(std::chrono::seconds(5));
  cluster.value().reset();
  system.shutdown();
  return left.ok() ? 0 : 1;
}
