#pragma once
// troupectl's client of one node's admin API, shared by the commands
// (commands.cpp) and the rolling update (rolling_update.cpp): a call that
// answers the JSON document of a 2xx answer or a Failure (the exit code and
// the one-line error), and how a member's advertised admin URL is reached.
// Internal to troupectl.

#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "commands.hpp"

namespace troupe::ctl::detail {

// Why a command could not print its result: the exit code and the line
// for stderr (without the "troupectl: " prefix).
struct Failure {
  int exit_code = exit_node_error;
  std::string message;
};
template <class T>
using Outcome = std::variant<T, Failure>;

inline Failure usage(std::string message) { return {exit_unreachable_or_usage, std::move(message)}; }

// "10s", "0.25s": a timeout as the user gave it.
std::string seconds_text(double s);

// "a, b, c".
std::string join(const std::vector<std::string>& parts);

// An answer's status and body, whatever the status: for endpoints whose
// status is the answer (GET /ready).
struct StatusAnswer {
  int status = 0;
  nlohmann::json body;       // discarded (is_discarded()) when not JSON
  std::string text;          // the body as sent
  std::string content_type;  // as sent; may be empty
};

// One node's admin API, at one URL. A plain value; each call makes its own
// connection, so calls from several threads are fine.
class NodeApi {
 public:
  NodeApi(std::string url, NodeUrl parsed, double timeout_s, std::string token, std::string ca_file)
      : url_(std::move(url)), parsed_(std::move(parsed)), timeout_s_(timeout_s), token_(std::move(token)),
        ca_file_(std::move(ca_file)) {}

  // The API at `url` (trailing '/' dropped); a bad URL is a usage Failure.
  // `o.token` is sent as a bearer token unless empty; `o.ca_file` is the
  // CA of an https:// node.
  static Outcome<NodeApi> at(std::string url, double timeout_s, const Options& o);

  const std::string& url() const noexcept { return url_; }
  bool tls() const noexcept { return parsed_.tls; }
  double timeout_s() const noexcept { return timeout_s_; }

  // The JSON document of a 2xx answer; any other answer is a Failure.
  Outcome<nlohmann::json> call(std::string method, const std::string& path) const;
  // The status and body of any answer; only no answer is a Failure.
  Outcome<StatusAnswer> status_of(std::string method, const std::string& path) const;
  // What call() makes of an answer: its document when 2xx, else a Failure.
  Outcome<nlohmann::json> document(const StatusAnswer& a) const;

 private:
  Failure unreachable(const std::string& why) const;

  std::string url_;
  NodeUrl parsed_;
  double timeout_s_;
  std::string token_;
  std::string ca_file_;
};

// The token in `file`, surrounding white space removed; a usage Failure
// naming the file when it cannot be read or is empty.
Outcome<std::string> read_token_file(const std::string& file);

// The admin URL a member advertises (`members[].admin` of /api/overview),
// usable from here: a node listening on every interface advertises 0.0.0.0
// (or ::), which means "my own address", so that host is taken from the
// member's cluster address instead. "—" when the member advertises none.
std::string reachable_admin(const nlohmann::json& member);

}  // namespace troupe::ctl::detail

namespace troupe::ctl::detail {

// The rolling-update command (rolling_update.cpp): the plan from the node
// at `api`, then each node in turn; progress lines to `out` as they happen.
// The last line (done, or the plan of a dry run), or why it stopped.
Outcome<std::string> rolling_update(const Options& o, const NodeApi& api, std::ostream& out);

}  // namespace troupe::ctl::detail
