#pragma once
// troupectl's commands: ask a running node's admin HTTP API, print what it
// answered as aligned tables (or as JSON for scripts). main.cpp only hands
// argv to run_command_line(); everything else lives in commands.cpp (the
// requests and the commands) and views.cpp (the tables), so the tests can
// drive the tool in-process against a real node (doc/troupectl.md).
//
//   troupe::ctl::Options o;
//   o.node = "http://127.0.0.1:8081";
//   o.command = troupe::ctl::Command::members;
//   int code = troupe::ctl::run(o, std::cout, std::cerr);   // 0, 1 or 2
//
// Every command but rolling-update makes one or two blocking HTTP requests
// and returns; rolling-update runs a shell command per node and polls until
// each is back (minutes). There is no state between calls. Thread safety: run() and run_command_line()
// share nothing, so concurrent calls are fine (each makes its own client).

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/result.hpp"

namespace troupe::ctl {

// The process exit codes, part of the tool's contract with scripts.
enum ExitCode : int {
  exit_ok = 0,
  // The node answered, but with an error (an {"error":...} document, an
  // unexpected status or a body that is not JSON), or what was asked for is
  // not there (a member that does not exist, a --type no shard has).
  exit_node_error = 1,
  // The node could not be asked: unreachable, no answer within the
  // timeout, or bad usage (unknown command, missing argument, bad --node).
  exit_unreachable_or_usage = 2,
  // The node refused the request for want of the right admin token (401).
  exit_unauthorized = 3,
};

enum class Command { status, members, shards, workers, job_workers, rebalance, drain, entity, rolling_update };

// What `rolling-update` does (doc/troupectl.md): for each node in turn, run
// the restart command, wait until a new process answers /ready 200,
// rebalance, wait until it hosts the shards it was given. Plain value type.
struct RollingUpdateOptions {
  // The shell command (/bin/sh -c) that restarts one node, with {node}
  // replaced by its id and {admin} by its admin URL; one of them is required.
  std::string restart;
  // The nodes in the order to restart them; empty: the members the node at
  // --node lists, in its order, that node itself last.
  std::vector<std::string> nodes;
  // "NODE=URL": a node's admin URL, where the members view has none or a
  // wrong one (behind NAT, a proxy).
  std::vector<std::string> admin;
  double exit_timeout_s = 120;   // how long the restart command may run
  double ready_timeout_s = 60;   // after it: until a new process answers /ready 200
  double shards_timeout_s = 60;  // after the rebalance: until it hosts what it was given
  double poll_s = 0.2;           // between two looks at the node
  bool dry_run = false;          // print the plan, restart nothing
};

// One invocation, as parsed from the command line. Plain value type.
struct Options {
  // The admin API of the node to talk to: http[s]://host[:port][/prefix].
  std::string node = "http://127.0.0.1:8081";
  bool json = false;  // print JSON instead of tables
  // The admin token, sent as "Authorization: Bearer <token>". run() reads
  // it from token_file when that is set (it wins); run_command_line() takes
  // it from the environment variable TROUPE_TOKEN otherwise.
  std::string token;
  std::string token_file;
  // https:// nodes: the CA the node's certificate must chain to (PEM);
  // empty: the system's trusted roots.
  std::string ca_file;
  // Seconds to wait for each answer; unset: 10, or 60 for rebalance (which
  // waits on the coordination store for every entity type).
  std::optional<double> timeout_s;
  Command command = Command::status;
  std::string type;        // shards --type (empty: every type); entity TYPE
  std::string id;          // entity ID
  std::string drain_node;  // drain NODE; empty: the node at `node`
  RollingUpdateOptions roll;
};

// Runs one command; returns an ExitCode. Results go to `out`; errors go to
// `err` as one line starting "troupectl: ". rolling-update writes its
// progress lines to `out` as they happen, flushed.
int run(const Options& options, std::ostream& out, std::ostream& err);

// Parses argv (CLI11; --node also from the environment variable
// TROUPE_NODE) and runs the command. Usage errors print the parser's
// message and return 2; --help and --version print to `out` and return 0.
int run_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// --- building blocks, exposed for the tests ------------------------------------------
namespace detail {

// A parsed --node URL: http:// or https://.
struct NodeUrl {
  std::string host;  // without brackets for IPv6
  std::uint16_t port = 80;  // 443 for https
  bool tls = false;         // https://
  std::string prefix;  // a path the admin API is mounted under, without the trailing '/'; often empty
};
// invalid_argument naming what is wrong (scheme, port, host).
Result<NodeUrl> parse_node_url(std::string_view url);

// Sorted, de-duplicated numbers as compact ranges: {0,1,2,3,7} -> "0-3,7".
std::string compact_ranges(std::vector<std::int64_t> numbers);

// Columns padded to their widest cell (UTF-8 aware, so "—" counts as one),
// three spaces apart, no trailing blanks; one line per row, header first.
std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows);

// "12.3s", "4m 05s", "2h 07m", "3d 04h".
std::string format_duration(double seconds);

// The human views of the node's documents, as the commands print them.
// `overview` is GET /api/overview, `cluster` is GET /cluster, `moves` is
// the answer of POST /rebalance, `entity` of GET /entities/{type}/{id}.
std::string render_status(const nlohmann::json& overview);
std::string render_members(const nlohmann::json& overview);
// The worker groups' units (group, unit, owner, epoch, age), a count, and
// a line when the node's last read from Redis failed.
std::string render_workers(const nlohmann::json& cluster);
// The node's job services' worker slots (service, slot, state, owner).
std::string render_job_workers(const nlohmann::json& cluster);
std::string render_rebalance(const nlohmann::json& moves);
std::string render_entity(const nlohmann::json& entity);
// What `shards` shows, as JSON: per type and owner the shard count and list
// (only `type`, if not empty). render_shards prints it as a table.
nlohmann::json summarize_shards(const nlohmann::json& cluster, const std::string& type);
std::string render_shards(const nlohmann::json& summary);

// A rolling update's restart command for one node: every {node} replaced by
// `node`, every {admin} by `admin`; other braces (a shell's ${VAR}) kept.
std::string restart_command(std::string_view pattern, const std::string& node, const std::string& admin);

}  // namespace detail
}  // namespace troupe::ctl
