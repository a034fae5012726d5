// troupectl rolling-update (doc/troupectl.md): the plan (which nodes, in
// which order, at which admin URLs), then for each node in turn its restart
// command, watched from outside: /ready and the process's uptime tell the
// old process, its drain, its absence and the new process apart; then a
// rebalance on the new process and the wait until it hosts what it was
// given. The first node that does not come back stops the update.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <ostream>
#include <thread>
#include <utility>

#include "json_fields.hpp"
#include "node_api.hpp"

extern char** environ;

namespace troupe::ctl::detail {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

std::string restart_command(std::string_view pattern, const std::string& node, const std::string& admin) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size();) {
    if (pattern.substr(i, 6) == "{node}") {
      out += node;
      i += 6;
    } else if (pattern.substr(i, 7) == "{admin}") {
      out += admin;
      i += 7;
    } else {
      out += pattern[i++];
    }
  }
  return out;
}

namespace {

struct Target {
  std::string id;
  std::string admin;  // the admin URL its restart is watched through
};

long long ms_since(SteadyClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t).count();
}

double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// --- the plan --------------------------------------------------------------------------

Outcome<std::map<std::string, std::string>> admin_map(const std::vector<std::string>& entries) {
  std::map<std::string, std::string> out;
  for (const auto& e : entries) {
    auto eq = e.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == e.size())
      return usage("--admin '" + e + "': expected NODE=URL (pay-1=http://10.0.0.1:8081)");
    std::string id = e.substr(0, eq);
    std::string url = e.substr(eq + 1);
    if (auto parsed = parse_node_url(url); !parsed.ok())
      return usage("--admin " + id + ": " + parsed.error().message());
    if (!out.emplace(id, url).second) return usage("--admin names '" + id + "' twice");
  }
  return out;
}

// The nodes to restart, in order, each with the admin URL to watch it at.
Outcome<std::vector<Target>> make_plan(const Options& o, const NodeApi& api) {
  const RollingUpdateOptions& r = o.roll;
  if (r.restart.empty()) return usage("rolling-update: --restart must not be empty");
  if (r.restart.find("{node}") == std::string::npos && r.restart.find("{admin}") == std::string::npos)
    return usage(
        "rolling-update: --restart must name the node with {node} (or {admin}): otherwise the same "
        "command would run for every node");
  for (double t : {r.exit_timeout_s, r.ready_timeout_s, r.shards_timeout_s, r.poll_s})
    if (!(t > 0)) return usage("rolling-update: timeouts must be positive");
  auto admins = admin_map(r.admin);
  if (auto* f = std::get_if<Failure>(&admins)) return *f;
  const auto& admin = std::get<std::map<std::string, std::string>>(admins);

  auto doc = api.call("GET", "/api/overview");
  if (auto* f = std::get_if<Failure>(&doc)) return *f;
  const json& ov = std::get<json>(doc);
  const std::string self = cell(ov, "node");
  std::vector<std::string> ids;
  std::map<std::string, const json*> member;
  for (const auto& m : array_field(ov, "members")) {
    ids.push_back(cell(m, "id"));
    member[ids.back()] = &m;
  }
  if (ids.empty()) return Failure{exit_node_error, "the node at " + api.url() + " lists no members"};

  std::vector<std::string> order = r.nodes;
  if (order.empty()) {
    for (const auto& id : ids)
      if (id != self) order.push_back(id);
    if (member.count(self)) order.push_back(self);
  }
  std::vector<Target> plan;
  std::map<std::string, bool> seen;
  for (const auto& id : order) {
    if (seen[id]) return usage("rolling-update: --nodes names '" + id + "' twice");
    seen[id] = true;
    if (!member.count(id))
      return Failure{exit_node_error, "'" + id + "' is not a member (" + self + " sees: " + join(ids) + ")"};
    std::string url;
    if (auto it = admin.find(id); it != admin.end()) {
      url = it->second;
    } else if (id == self) {
      url = api.url();  // the one URL known to work
    } else {
      url = reachable_admin(*member[id]);
      if (url == "—")
        return Failure{exit_node_error, self + " does not know the admin URL of '" + id +
                                            "' (it has not heard from it yet): give it with --admin " + id +
                                            "=URL"};
    }
    plan.push_back({id, url});
  }
  for (const auto& [id, url] : admin)
    if (!seen.count(id))
      return usage("--admin names '" + id + "', which is not among the nodes to restart (" + join(order) +
                   ")");
  return plan;
}

// --- one node's restart ---------------------------------------------------------------

// The restart command, running in a process group of its own (so that a
// command past its time is stopped with everything it started).
class Command {
 public:
  static Outcome<Command> spawn(const std::string& command) {
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    // No stdin; its stdout joins troupectl's stderr, so stdout keeps only
    // the progress lines.
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
    pid_t pid = 0;
    int rc = posix_spawn(&pid, "/bin/sh", &fa, &attr, const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) return Failure{exit_node_error, std::string("cannot run /bin/sh: ") + std::strerror(rc)};
    return Command(pid);
  }

  // nullopt while it runs; then its wait status.
  std::optional<int> poll() {
    if (done_) return status_;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) != pid_) return std::nullopt;
    done_ = true;
    status_ = st;
    return st;
  }

  void kill() {
    ::kill(-pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    done_ = true;
    status_ = st;
  }

  static std::string describe(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
    return "ended with wait status " + std::to_string(status);
  }

 private:
  explicit Command(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  bool done_ = false;
  int status_ = 0;
};

// What one look at the node showed.
enum class Seen { old_ready, old_not_ready, draining, down, starting, ready };

struct Look {
  Seen seen = Seen::old_ready;
  std::string detail;    // for a failure's message: the last answer, or why there was none
  double uptime_s = -1;  // the answering process's, when known
};

// One look. GET /api/overview first: its uptime_s tells the process that
// was there before the restart command started (up longer than that) from
// a new one, and its ready and draining what the old one is doing. A new
// process is ready when GET /ready, what a balancer asks, answers 200.
Look look(const NodeApi& api, SteadyClock::time_point restart_started) {
  Look l;
  auto ov = api.call("GET", "/api/overview");
  // Measured after the answer: a process started after the command is
  // then always up less than this, however long the request took.
  const double since_restart = seconds_since(restart_started);
  if (auto* f = std::get_if<Failure>(&ov)) {
    l.seen = Seen::down;
    l.detail = f->message;
    return l;
  }
  const json& doc = std::get<json>(ov);
  auto is_true = [&](const char* key) { return field(doc, key).is_boolean() && field(doc, key).get<bool>(); };
  const json& uptime = field(doc, "uptime_s");
  if (uptime.is_number()) l.uptime_s = uptime.get<double>();
  // Without an uptime only readiness counts: a restart that leaves the old
  // process up is then not told apart.
  if (uptime.is_number() && l.uptime_s >= since_restart) {
    l.seen = is_true("ready") ? Seen::old_ready : is_true("draining") ? Seen::draining : Seen::old_not_ready;
    l.detail = std::string("the process from before the restart (up ") + format_duration(l.uptime_s) +
               ") is " +
               (l.seen == Seen::draining    ? "draining"
                : l.seen == Seen::old_ready ? "ready"
                                            : "not ready");
    return l;
  }
  auto ready = api.status_of("GET", "/ready");
  if (auto* f = std::get_if<Failure>(&ready)) {
    l.seen = Seen::starting;
    l.detail = f->message;
    return l;
  }
  const StatusAnswer& a = std::get<StatusAnswer>(ready);
  l.seen = a.status == 200 ? Seen::ready : Seen::starting;
  l.detail = "/ready answers " + std::to_string(a.status) +
             (field(a.body, "checks").is_object() ? " " + a.body["checks"].dump() : "");
  return l;
}

// One node's restart, rebalance and shard wait; prints a line at each
// change it sees. The failure's message says why the node did not come back.
class NodeRestart {
 public:
  NodeRestart(const Options& o, const Target& t, std::string prefix, std::ostream& out)
      : o_(o), r_(o.roll), t_(t), prefix_(std::move(prefix)), out_(out) {}

  Outcome<std::string> run() {
    // Short looks, so that a node that hangs does not stall the watch.
    auto api = NodeApi::at(t_.admin, std::min(o_.timeout_s.value_or(10.0), 2.0), o_);
    if (auto* f = std::get_if<Failure>(&api)) return *f;
    const NodeApi& node = std::get<NodeApi>(api);
    const std::string command = restart_command(r_.restart, t_.id, t_.admin);
    say("restarting: " + command);
    started_ = SteadyClock::now();
    auto cmd = Command::spawn(command);
    if (auto* f = std::get_if<Failure>(&cmd)) return *f;
    if (auto f = watch_restart(std::get<Command>(cmd), node)) return *f;
    auto given = rebalance();
    if (auto* f = std::get_if<Failure>(&given)) return *f;
    // Two app versions live: the node fills up as the old ones drain (what
    // they hand off goes to the newest), and the last node's rebalance,
    // once one version remains, evens it out.
    if (std::get<std::int64_t>(given) < 0) return std::string();
    return wait_for_shards(node, std::get<std::int64_t>(given));
  }

 private:
  void say(const std::string& line) { out_ << prefix_ << line << '\n' << std::flush; }
  std::string after() const { return "after " + std::to_string(ms_since(started_)) + " ms"; }
  Failure fail(std::string why) const { return Failure{exit_node_error, std::move(why)}; }
  void pause() const { std::this_thread::sleep_for(std::chrono::duration<double>(r_.poll_s)); }

  // Until the command has ended well and a new process answers /ready 200.
  std::optional<Failure> watch_restart(Command& cmd, const NodeApi& node) {
    std::optional<SteadyClock::time_point> ended;
    Seen last = Seen::old_ready;  // as it was before: not worth a line
    for (;;) {
      if (!ended) {
        if (auto st = cmd.poll()) {
          if (!(WIFEXITED(*st) && WEXITSTATUS(*st) == 0))
            return fail("the restart command " + Command::describe(*st));
          ended = SteadyClock::now();
          say("restart command done " + after());
        } else if (seconds_since(started_) > r_.exit_timeout_s) {
          cmd.kill();
          return fail("the restart command did not finish within " + seconds_text(r_.exit_timeout_s) +
                      " (--exit-timeout); it was stopped with SIGKILL");
        }
      }
      Look l = look(node, started_);
      if (l.seen != last) {
        last = l.seen;
        report(l);
      }
      if (ended && l.seen == Seen::ready) return std::nullopt;
      if (ended && seconds_since(*ended) > r_.ready_timeout_s) return fail(not_ready(l));
      pause();
    }
  }

  void report(const Look& l) {
    const char* word = "";
    switch (l.seen) {
      case Seen::old_ready:
        word = "ready again, still the process from before ";
        break;
      case Seen::old_not_ready:
        word = "not ready (/ready 503) ";
        break;
      case Seen::draining:
        word = "draining ";
        break;
      case Seen::down:
        word = "down (its admin API does not answer) ";
        break;
      case Seen::starting:
        word = "started again, not ready yet ";
        break;
      case Seen::ready:
        word = "ready ";
        break;
    }
    bool fresh = l.seen == Seen::ready && l.uptime_s >= 0;
    say(word + after() + (fresh ? " (a new process, up " + format_duration(l.uptime_s) + ")" : ""));
  }

  std::string not_ready(const Look& l) const {
    std::string within =
        " within " + seconds_text(r_.ready_timeout_s) + " after the restart command (--ready-timeout)";
    switch (l.seen) {
      case Seen::old_ready:
        return "it did not restart: the node at " + t_.admin +
               " still runs the process from before the restart (up " + format_duration(l.uptime_s) + ")";
      case Seen::old_not_ready:
      case Seen::draining:
        return "it did not restart" + within + ": " + l.detail;
      case Seen::down:
        return "not back" + within + ": " + l.detail;
      case Seen::starting:
      case Seen::ready:
        break;
    }
    return "not ready" + within + ": " + l.detail;
  }

  // In a cluster: the rebalance that gives the new process its share.
  // The number of entity shards it was given; -1 when rebalancing waits
  // because the live members run more than one app version.
  Outcome<std::int64_t> rebalance() {
    auto api = NodeApi::at(t_.admin, o_.timeout_s.value_or(60.0), o_);
    if (auto* f = std::get_if<Failure>(&api)) return *f;
    const NodeApi& node = std::get<NodeApi>(api);
    auto ov = node.call("GET", "/api/overview");
    if (auto* f = std::get_if<Failure>(&ov)) return fail("reading its overview failed: " + f->message);
    if (cell(std::get<json>(ov), "mode") != "cluster") return std::int64_t{0};
    const auto deadline = SteadyClock::now() + std::chrono::duration<double>(r_.shards_timeout_s);
    for (;;) {
      auto answer = node.status_of("POST", "/rebalance");
      if (auto* f = std::get_if<Failure>(&answer)) return fail("the rebalance failed: " + f->message);
      const StatusAnswer& a = std::get<StatusAnswer>(answer);
      // One rebalance at a time per node: wait for the one running.
      bool busy = a.status == 409 && cell(field(a.body, "error"), "code") == "rebalance_running";
      if (busy && SteadyClock::now() < deadline) {
        pause();
        continue;
      }
      auto doc = node.document(a);
      if (auto* f = std::get_if<Failure>(&doc)) return fail("the rebalance failed: " + f->message);
      if (cell(std::get<json>(doc), "outcome") == "versions_mixed") {
        say("not rebalanced: " + cell(std::get<json>(doc), "message") +
            "; it takes the shards the old version's nodes hand off");
        return std::int64_t{-1};
      }
      std::map<std::string, std::int64_t> to_it;  // per type (or jobs/<queue>)
      std::int64_t entity_shards = 0;
      for (const auto& m : array_field(std::get<json>(doc), "moved")) {
        if (field(m, "to") != t_.id) continue;
        std::string type = cell(m, "type");
        ++to_it[type];
        // Job queues' shards and projections' slices move too; the node
        // counts only entity shards as hosted.
        if (type.rfind("jobs/", 0) != 0 && type.rfind("projections/", 0) != 0) ++entity_shards;
      }
      std::string what;
      for (const auto& [type, n] : to_it) what += (what.empty() ? "" : ", ") + type + " " + std::to_string(n);
      say(to_it.empty()
              ? "rebalanced: nothing moved to it"
              : "rebalanced: " + std::to_string(entity_shards) + " entity shards moved to it (" + what + ")");
      return entity_shards;
    }
  }

  // Whether every entity type has fewer shards placed than there are
  // members, as the node's shard map (GET /cluster) shows; and the counts.
  static std::pair<bool, std::string> too_few_placed(const NodeApi& node) {
    auto doc = node.call("GET", "/cluster");
    if (auto* f = std::get_if<Failure>(&doc))
      return {false, "its shard map could not be read: " + f->message};
    const json& c = std::get<json>(doc);
    std::map<std::string, std::size_t> placed;
    for (const auto& s : array_field(c, "shards")) ++placed[cell(s, "type")];
    const std::size_t members = array_field(c, "members").size();
    bool few = true;
    std::string counts;
    for (const auto& [type, n] : placed) {
      few = few && n < members;
      counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " of " + type;
    }
    return {few,
            (counts.empty() ? "no shards" : counts) + " placed over " + std::to_string(members) + " members"};
  }

  // Until it hosts at least one shard, and at least the `given` the
  // rebalance moved to it (each is started here once its old owner has
  // handed it off), as the node itself counts them (shards_hosted).
  Outcome<std::string> wait_for_shards(const NodeApi& node, std::int64_t given) {
    const std::int64_t want = std::max<std::int64_t>(1, given);
    const auto deadline = SteadyClock::now() + std::chrono::duration<double>(r_.shards_timeout_s);
    std::string last = "no answer yet";
    for (;;) {
      auto ov = node.call("GET", "/api/overview");
      if (auto* doc = std::get_if<json>(&ov)) {
        const json& types = array_field(*doc, "entity_types");
        std::int64_t hosted = 0;
        for (const auto& t : types) hosted += int_field(t, "shards_hosted").value_or(0);
        if (types.empty()) {
          say("serves no entity types: no shards to own");
          return std::string();
        }
        if (hosted >= want) {
          say("owns " + std::to_string(hosted) + (hosted == 1 ? " shard " : " shards ") + after());
          return std::string();
        }
        last = "it hosts " + std::to_string(hosted);
        if (hosted == 0 && given == 0 && cell(*doc, "mode") == "cluster") {
          // A rebalance leaves a member without shards only where a type
          // has fewer placed than there are members (placement is on first
          // use): then there is nothing for it to own yet.
          auto few = too_few_placed(node);
          if (few.first) {
            say("owns no shards: the rebalance moved none to it (" + few.second + ")");
            return std::string();
          }
          last += ", though " + few.second;
        }
      } else {
        last = std::get<Failure>(ov).message;
      }
      if (SteadyClock::now() >= deadline)
        return fail(
            "it does not host " +
            (given > 0 ? "the " + std::to_string(given) + " shards it was given" : std::string("any shard")) +
            " within " + seconds_text(r_.shards_timeout_s) + " (--shards-timeout): " + last);
      pause();
    }
  }

  const Options& o_;
  const RollingUpdateOptions& r_;
  const Target& t_;
  std::string prefix_;
  std::ostream& out_;
  SteadyClock::time_point started_;
};

std::string render_plan(const Options& o, const std::vector<Target>& plan) {
  std::vector<std::vector<std::string>> rows;
  for (std::size_t i = 0; i < plan.size(); ++i)
    rows.push_back({std::to_string(i + 1), plan[i].id, plan[i].admin,
                    restart_command(o.roll.restart, plan[i].id, plan[i].admin)});
  const auto& r = o.roll;
  return "rolling update plan (dry run: nothing is restarted)\n" +
         format_table({"STEP", "NODE", "ADMIN", "RESTART COMMAND"}, rows) +
         "each node in turn: its restart command (at most " + seconds_text(r.exit_timeout_s) +
         "), then /ready 200 from a new process (within " + seconds_text(r.ready_timeout_s) +
         "), a rebalance, and the shards it was given hosted (within " + seconds_text(r.shards_timeout_s) +
         "); the first node that does not come back stops the update\n";
}

}  // namespace

Outcome<std::string> rolling_update(const Options& o, const NodeApi& api, std::ostream& out) {
  auto planned = make_plan(o, api);
  if (auto* f = std::get_if<Failure>(&planned)) return *f;
  const auto& plan = std::get<std::vector<Target>>(planned);
  if (o.roll.dry_run) return render_plan(o, plan);
  std::vector<std::string> ids;
  for (const auto& t : plan) ids.push_back(t.id);
  out << "rolling update of " << plan.size() << (plan.size() == 1 ? " node: " : " nodes: ") << join(ids)
      << '\n'
      << std::flush;
  const auto t0 = SteadyClock::now();
  for (std::size_t i = 0; i < plan.size(); ++i) {
    std::string step = plan[i].id + " (" + std::to_string(i + 1) + "/" + std::to_string(plan.size()) + ")";
    auto done = NodeRestart(o, plan[i], step + ": ", out).run();
    if (auto* f = std::get_if<Failure>(&done)) {
      std::vector<std::string> rest(ids.begin() + static_cast<std::ptrdiff_t>(i) + 1, ids.end());
      return Failure{exit_node_error, "rolling update stopped at " + step + ": " + f->message +
                                          (rest.empty() ? "" : "; not restarted: " + join(rest))};
    }
  }
  return "rolling update done: " + std::to_string(plan.size()) + (plan.size() == 1 ? " node" : " nodes") +
         " restarted in " + format_duration(seconds_since(t0)) + "\n";
}

}  // namespace troupe::ctl::detail
