// troupectl's commands: see commands.hpp and doc/troupectl.md.
//
// The JSON shapes read here are the admin API's, as Node::overview(),
// Node::cluster_view() and the routes in src/node/node.cpp build them.
// Every field is read defensively (absent, null or of another type shows
// as "—"), so a node of another version still gets a readable table
// rather than an exception.

#include "commands.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <variant>

#include "troupe/net/http.hpp"
#include "troupe/net/url.hpp"

namespace troupe::ctl {

using json = nlohmann::json;

namespace detail {

// --- URLs and encoding ----------------------------------------------------------------

Result<NodeUrl> parse_node_url(std::string_view url) {
  auto bad = [&](std::string why) {
    return Error(ErrorCode::invalid_argument, "--node '" + std::string(url) + "': " + std::move(why));
  };
  auto parsed = http::parse_url(url);
  if (!parsed.ok()) {
    std::string why = parsed.error().message();
    if (url.find("://") != std::string_view::npos && url.substr(0, 7) != "http://")
      why += " (the admin API has no TLS; put a proxy in front for that)";
    return bad(std::move(why));
  }
  NodeUrl out;
  out.host = std::move(parsed->host);
  out.port = parsed->port;
  if (parsed->has_path) {
    std::string_view path = parsed->target;
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    if (path.find_first_of("?#") != std::string_view::npos) return bad("no query or fragment allowed");
    out.prefix = std::string(path);
  }
  return out;
}

std::string percent_encode(std::string_view segment) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(segment.size());
  for (unsigned char c : segment) {
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 0xF]);
    }
  }
  return out;
}

std::string compact_ranges(std::vector<std::int64_t> numbers) {
  std::sort(numbers.begin(), numbers.end());
  numbers.erase(std::unique(numbers.begin(), numbers.end()), numbers.end());
  std::string out;
  for (std::size_t i = 0; i < numbers.size();) {
    std::size_t j = i;
    while (j + 1 < numbers.size() && numbers[j + 1] == numbers[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(numbers[i]);
    if (j > i) out += '-' + std::to_string(numbers[j]);
    i = j + 1;
  }
  return out;
}

// --- text ---------------------------------------------------------------------------

namespace {

// Code points, not bytes: "—" and non-ASCII ids must not skew the columns.
// (Wide CJK characters would still count as one; ids rarely use them.)
std::size_t display_width(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

const std::string kNone = "—";

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// One JSON value as a table cell.
std::string cell(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return kNone;
    case json::value_t::boolean:
      return v.get<bool>() ? "yes" : "no";
    case json::value_t::number_integer:
      return std::to_string(v.get<std::int64_t>());
    case json::value_t::number_unsigned:
      return std::to_string(v.get<std::uint64_t>());
    case json::value_t::number_float:
      return fixed(v.get<double>(), 1);
    case json::value_t::string: {
      const auto& s = v.get_ref<const std::string&>();
      return s.empty() ? kNone : s;
    }
    default:
      return v.dump();
  }
}

const json& field(const json& obj, const char* key) {
  static const json null_value;
  if (!obj.is_object()) return null_value;
  auto it = obj.find(key);
  return it == obj.end() ? null_value : *it;
}

std::string cell(const json& obj, const char* key) { return cell(field(obj, key)); }

std::optional<std::int64_t> int_field(const json& obj, const char* key) {
  const json& v = field(obj, key);
  if (v.is_number_integer() || v.is_number_unsigned()) return v.get<std::int64_t>();
  if (v.is_number_float()) return static_cast<std::int64_t>(v.get<double>());
  return std::nullopt;
}

const json& array_field(const json& obj, const char* key) {
  static const json empty = json::array();
  const json& v = field(obj, key);
  return v.is_array() ? v : empty;
}

// "2025-05-01T12:00:00.123Z" for milliseconds since the epoch.
std::string utc_ms(std::int64_t ms) {
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  return buf;
}

// How long until a deadline, measured on the node's clock: "59m 58s",
// "overdue by 3.0s".
std::string time_left(std::int64_t deadline_ms, std::int64_t node_now_ms) {
  std::int64_t left = deadline_ms - node_now_ms;
  if (left < 0) return "overdue by " + format_duration(static_cast<double>(-left) / 1000.0);
  return format_duration(static_cast<double>(left) / 1000.0);
}

// A pattern's figures on one line: "grants=3 waits=0 queued_by_priority=[priority=0 depth=2]".
std::string figures(const json& v) {
  if (v.is_object()) {
    std::string out;
    for (const auto& [k, x] : v.items()) {
      if (!out.empty()) out += ' ';
      out += k + '=' + (x.is_structured() ? figures(x) : cell(x));
    }
    return v.empty() ? "{}" : out;
  }
  if (v.is_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "; " : "") + figures(v[i]);
    return out + "]";
  }
  return cell(v);
}

std::string state_word(const json& doc) {
  if (field(doc, "draining").is_boolean() && field(doc, "draining").get<bool>()) return "draining";
  if (field(doc, "ready").is_boolean()) return field(doc, "ready").get<bool>() ? "ready" : "not ready";
  return kNone;
}

}  // namespace

std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width(header.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], display_width(row[i]));
  };
  measure(header);
  for (const auto& r : rows) measure(r);
  std::string out;
  auto line = [&](const std::vector<std::string>& row) {
    std::string l;
    for (std::size_t i = 0; i < width.size(); ++i) {
      const std::string& c = i < row.size() ? row[i] : kNone;
      l += c;
      if (i + 1 < width.size()) l.append(width[i] - display_width(c) + 3, ' ');
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    out += l + '\n';
  };
  line(header);
  for (const auto& r : rows) line(r);
  return out;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0)) seconds = 0;  // also NaN
  if (seconds < 60) return fixed(seconds, 1) + "s";
  auto s = static_cast<std::int64_t>(seconds);
  char buf[64];
  if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm %02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else if (s < 86400) {
    std::snprintf(buf, sizeof buf, "%lldh %02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldd %02lldh", static_cast<long long>(s / 86400),
                  static_cast<long long>(s % 86400 / 3600));
  }
  return buf;
}

// --- the views ------------------------------------------------------------------------

// The node's health as /api/overview reports it: "ok", "unhealthy (N
// services)", or none when the node does not report it.
std::string health_word(const json& o) {
  const json& h = field(o, "health");
  const json& st = field(h, "status");
  if (!st.is_string()) return kNone;
  if (st.get<std::string>() != "unhealthy") return st.get<std::string>();
  std::size_t down = 0;
  const json& services = field(h, "services");
  if (services.is_object())
    for (const auto& [name, v] : services.items())
      if (field(v, "up").is_boolean() && !field(v, "up").get<bool>()) ++down;
  return "unhealthy (" + std::to_string(down) + (down == 1 ? " service)" : " services)");
}

std::string render_status(const json& o) {
  std::string out;
  const json& members = array_field(o, "members");
  std::size_t alive = 0;
  for (const auto& m : members)
    if (field(m, "alive").is_boolean() && field(m, "alive").get<bool>()) ++alive;
  const json& uptime = field(o, "uptime_s");
  std::vector<std::vector<std::string>> head = {
      {"node", cell(o, "node")},
      {"mode", cell(o, "mode")},
      {"state", state_word(o)},
      {"health", health_word(o)},
      {"uptime", uptime.is_number() ? format_duration(uptime.get<double>()) : kNone},
      {"version", cell(o, "version")},
      {"members", std::to_string(members.size()) + " (" + std::to_string(alive) + " alive)"},
  };
  // A key/value block reads better without a header line.
  std::string block = format_table({"", ""}, head);
  out += block.substr(block.find('\n') + 1);

  const json& services = field(field(o, "health"), "services");
  if (services.is_object()) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& [name, v] : services.items())
      if (field(v, "up").is_boolean() && !field(v, "up").get<bool>())
        rows.push_back({name, cell(v, "code"), cell(v, "message")});
    if (!rows.empty()) out += "\nfailing\n" + format_table({"SERVICE", "CODE", "WHY"}, rows);
  }

  std::vector<std::vector<std::string>> types;
  for (const auto& t : array_field(o, "entity_types"))
    types.push_back({cell(t, "type"), cell(t, "active"), cell(t, "processing"), cell(t, "passivations"),
                     cell(t, "shards_hosted"), cell(t, "events_persisted")});
  out += '\n';
  if (types.empty()) {
    out += "no entity types served\n";
  } else {
    out += format_table({"TYPE", "ACTIVE", "PROCESSING", "PASSIVATIONS", "SHARDS", "EVENTS"}, types);
  }

  const json& processing = array_field(o, "processing");
  if (!processing.empty()) {
    auto now = int_field(o, "time_ms");
    std::vector<std::vector<std::string>> rows;
    for (const auto& p : processing) {
      auto age = int_field(p, "age_ms");
      auto deadline = int_field(p, "deadline_ms");
      rows.push_back({cell(p, "type"), cell(p, "id"),
                      age ? format_duration(static_cast<double>(*age) / 1000.0) : kNone,
                      deadline && now ? time_left(*deadline, *now) : kNone});
    }
    out += "\nprocessing, longest first\n";
    out += format_table({"TYPE", "ID", "AGE", "DEADLINE IN"}, rows);
  }

  const json& counters = field(o, "counters");
  if (counters.is_object() && !counters.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& [name, v] : counters.items()) rows.push_back({name, cell(v)});
    out += '\n' + format_table({"COUNTER", "VALUE"}, rows);
  }

  const json& patterns = field(o, "patterns");
  if (patterns.is_object() && !patterns.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& [name, v] : patterns.items()) rows.push_back({name, figures(v)});
    out += '\n' + format_table({"PATTERN", "FIGURES"}, rows);
  }
  return out;
}

std::string render_members(const json& o) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& m : array_field(o, "members"))
    rows.push_back({cell(m, "id"), cell(m, "address"), cell(m, "alive"), cell(m, "self"), cell(m, "draining"),
                    cell(m, "shards"), cell(m, "entities_active"), cell(m, "mailbox_depth"),
                    cell(m, "messages_per_s")});
  if (rows.empty()) return "no members\n";
  return format_table(
      {"ID", "ADDRESS", "ALIVE", "SELF", "DRAINING", "SHARDS", "ENTITIES", "MAILBOX", "MSG/S"}, rows);
}

std::string render_workers(const json& c) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& w : array_field(c, "workers"))
    rows.push_back({cell(w, "group"), cell(w, "unit"), cell(w, "owner")});
  if (rows.empty()) return "no workers\n";
  return format_table({"GROUP", "UNIT", "OWNER"}, rows);
}

std::string render_rebalance(const json& r) {
  const json& moved = array_field(r, "moved");
  if (moved.empty()) return "nothing moved: the shards are already balanced\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& m : moved)
    rows.push_back({cell(m, "type"), cell(m, "shard"), cell(m, "from"), cell(m, "to"), cell(m, "epoch")});
  std::string out = "moved " + std::to_string(moved.size()) + (moved.size() == 1 ? " shard\n" : " shards\n");
  return out + format_table({"TYPE", "SHARD", "FROM", "TO", "EPOCH"}, rows);
}

std::string render_entity(const json& e) {
  std::vector<std::vector<std::string>> head = {{"type", cell(e, "type")}, {"id", cell(e, "id")}};
  const json& p = field(e, "processing");
  if (p.is_object()) {
    auto since = int_field(p, "since_ms");
    auto age = int_field(p, "age_ms");
    auto deadline = int_field(p, "deadline_ms");
    std::string text = "yes";
    if (since) text += ", since " + utc_ms(*since);
    if (age) text += " (" + format_duration(static_cast<double>(*age) / 1000.0) + " ago)";
    if (deadline) {
      text += ", deadline " + utc_ms(*deadline);
      // The node's now is since + age: the deadline is measured on its clock.
      if (since && age)
        text += " (" + (*deadline >= *since + *age ? "in " : std::string()) +
                time_left(*deadline, *since + *age) + ")";
    }
    head.push_back({"processing", text});
  } else {
    head.push_back({"processing", "no"});
  }
  const json& state = field(e, "state");
  if (state.is_null()) head.push_back({"state", kNone + " (this entity type does not describe its state)"});
  std::string block = format_table({"", ""}, head);
  std::string out = block.substr(block.find('\n') + 1);
  if (!state.is_null()) out += "state\n" + state.dump(2) + '\n';
  return out;
}

json summarize_shards(const json& c, const std::string& type) {
  std::set<std::string> live;
  for (const auto& m : array_field(c, "members"))
    if (!field(m, "alive").is_boolean() || field(m, "alive").get<bool>()) live.insert(cell(m, "id"));
  // Types in the order the node lists them, owners by id.
  std::vector<std::string> order;
  std::map<std::string, std::map<std::string, std::vector<std::int64_t>>> by_type;
  for (const auto& s : array_field(c, "shards")) {
    std::string t = cell(s, "type");
    if (!type.empty() && t != type) continue;
    auto shard = int_field(s, "shard");
    if (!shard) continue;
    if (!by_type.count(t)) order.push_back(t);
    by_type[t][cell(s, "owner")].push_back(*shard);
  }
  json types = json::array();
  for (const auto& t : order) {
    json owners = json::array();
    std::size_t total = 0;
    for (auto& [owner, shards] : by_type[t]) {
      std::sort(shards.begin(), shards.end());
      total += shards.size();
      owners.push_back({{"owner", owner},
                        {"member", live.count(owner) > 0},
                        {"count", shards.size()},
                        {"shards", shards},
                        {"ranges", compact_ranges(shards)}});
    }
    types.push_back({{"type", t}, {"shards", total}, {"owners", owners}});
  }
  return {{"node", field(c, "node")}, {"types", types}};
}

std::string render_shards(const json& summary) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : array_field(summary, "types")) {
    for (const auto& o : array_field(t, "owners")) {
      std::string owner = cell(o, "owner");
      // The placement store may still name a node that left or died, until
      // the coordinator moves its shards.
      if (field(o, "member").is_boolean() && !field(o, "member").get<bool>()) owner += " (not a live member)";
      rows.push_back({cell(t, "type"), owner, cell(o, "count"), cell(o, "ranges")});
    }
  }
  if (rows.empty()) return "no shards assigned\n";
  return format_table({"TYPE", "OWNER", "SHARDS", "LIST"}, rows);
}

}  // namespace detail

// --- talking to the node ----------------------------------------------------------------

namespace {

using detail::NodeUrl;

// Why a command could not print its result: the exit code and the line
// for stderr (without the "troupectl: " prefix).
struct Failure {
  int exit_code = exit_node_error;
  std::string message;
};
template <class T>
using Outcome = std::variant<T, Failure>;

Failure usage(std::string message) { return {exit_unreachable_or_usage, std::move(message)}; }

std::string text_of(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// "10s", "0.25s": the timeout as the user gave it.
std::string seconds_text(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%gs", s);
  return buf;
}

// The transport's reason without its "cannot connect to host:port: " lead,
// which the one-liner already says in its own words.
std::string reason_of(const Error& e, const std::string& where) {
  std::string m = e.message();
  for (std::string_view lead : {"client: ", "cannot connect to ", "request to "}) {
    if (m.rfind(lead, 0) == 0) {
      m.erase(0, lead.size());
      break;
    }
  }
  if (auto at = m.find(where + ": "); at != std::string::npos) m.erase(0, at + where.size() + 2);
  if (auto at = m.find(where + " failed: "); at != std::string::npos) m.erase(0, at + where.size() + 9);
  // asio's messages are capitalised ("Connection refused"); the one-liner is not.
  if (m.size() > 1 && m[0] >= 'A' && m[0] <= 'Z' && m[1] >= 'a' && m[1] <= 'z')
    m[0] = static_cast<char>(m[0] - 'A' + 'a');
  return m;
}

// One node's admin API, at one URL.
class NodeApi {
 public:
  NodeApi(std::string url, NodeUrl parsed, double timeout_s)
      : url_(std::move(url)), parsed_(std::move(parsed)), timeout_s_(timeout_s) {}

  static Outcome<NodeApi> at(std::string url, double timeout_s) {
    while (url.size() > 1 && url.back() == '/') url.pop_back();
    auto parsed = detail::parse_node_url(url);
    if (!parsed.ok()) return usage(parsed.error().message());
    return NodeApi(std::move(url), std::move(*parsed), timeout_s);
  }

  const std::string& url() const noexcept { return url_; }

  // The JSON document of a 2xx answer.
  Outcome<json> call(std::string method, const std::string& path) const {
    auto timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(timeout_s_));
    http::ClientSettings cs;
    cs.host = parsed_.host;
    cs.port = parsed_.port;
    cs.max_connections = 1;
    cs.request_timeout = timeout;
    cs.connect_timeout = std::min<Duration>(timeout, std::chrono::seconds(5));
    const std::string where = http::authority(parsed_.host, parsed_.port);
    auto client = http::Client::create(cs);
    if (!client.ok()) return unreachable(reason_of(client.error(), where));
    http::ClientRequest req;
    req.method = std::move(method);
    req.target = parsed_.prefix + path;
    req.headers.emplace_back("Accept", "application/json");
    auto resp = (*client)->request_sync(std::move(req));
    if (!resp.ok()) {
      if (resp.error().code() == ErrorCode::timeout)
        return Failure{exit_unreachable_or_usage,
                       "the node at " + url_ + " did not answer within " + seconds_text(timeout_s_)};
      return unreachable(reason_of(resp.error(), where));
    }
    return decode(*resp);
  }

 private:
  Failure unreachable(const std::string& why) const {
    return {exit_unreachable_or_usage, "cannot reach the node at " + url_ + " (" + why + ")"};
  }

  Outcome<json> decode(const http::Response& r) const {
    json body = json::parse(r.body, nullptr, false);
    if (r.status >= 200 && r.status < 300) {
      if (body.is_discarded())
        return Failure{exit_node_error, "the node at " + url_ + " answered HTTP " + std::to_string(r.status) +
                                            " with a body that is not JSON" + content_type(r)};
      return body;
    }
    const json& e = detail::field(body, "error");
    if (e.is_object() && e.contains("message") && e.contains("code")) {
      return Failure{exit_node_error, text_of(e["message"]) + " (" + text_of(e["code"]) + ", HTTP " +
                                          std::to_string(r.status) + ")"};
    }
    // Not a troupe node's error document (a proxy, another server).
    std::string excerpt = r.body.substr(0, 200);
    std::replace(excerpt.begin(), excerpt.end(), '\n', ' ');
    std::replace(excerpt.begin(), excerpt.end(), '\r', ' ');
    return Failure{exit_node_error, "the node at " + url_ + " answered HTTP " + std::to_string(r.status) +
                                        " " + std::string(http::reason_phrase(r.status)) +
                                        (excerpt.empty() ? "" : ": " + excerpt)};
  }

  static std::string content_type(const http::Response& r) {
    return r.content_type.empty() ? "" : " (" + r.content_type + ")";
  }

  std::string url_;
  NodeUrl parsed_;
  double timeout_s_;
};

std::string pretty(const json& j) { return j.dump(2) + '\n'; }

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

// Runs `call` and hands its document to `show`, or passes the failure on.
template <class Show>
Outcome<std::string> fetch_and(const NodeApi& api, std::string method, const std::string& path, Show&& show) {
  auto doc = api.call(std::move(method), path);
  if (auto* f = std::get_if<Failure>(&doc)) return *f;
  return show(std::get<json>(doc));
}

Outcome<std::string> status(const Options& o, const NodeApi& api) {
  return fetch_and(api, "GET", "/api/overview", [&](const json& j) -> Outcome<std::string> {
    return o.json ? pretty(j) : detail::render_status(j);
  });
}

Outcome<std::string> members(const Options& o, const NodeApi& api) {
  return fetch_and(api, "GET", "/api/overview", [&](const json& j) -> Outcome<std::string> {
    if (o.json)
      return pretty({{"node", detail::field(j, "node")}, {"members", detail::array_field(j, "members")}});
    return detail::render_members(j);
  });
}

Outcome<std::string> shards(const Options& o, const NodeApi& api) {
  return fetch_and(api, "GET", "/cluster", [&](const json& j) -> Outcome<std::string> {
    json summary = detail::summarize_shards(j, o.type);
    if (!o.type.empty() && summary["types"].empty()) {
      std::vector<std::string> known;
      json all = detail::summarize_shards(j, "");
      for (const auto& t : all["types"]) known.push_back(t["type"].get<std::string>());
      return Failure{exit_node_error,
                     "no shards of type '" + o.type + "' in the shard map of " + detail::cell(j, "node") +
                         (known.empty() ? " (it is empty)" : " (types: " + join(known) + ")")};
    }
    return o.json ? pretty(summary) : detail::render_shards(summary);
  });
}

Outcome<std::string> workers(const Options& o, const NodeApi& api) {
  return fetch_and(api, "GET", "/cluster", [&](const json& j) -> Outcome<std::string> {
    if (o.json)
      return pretty({{"node", detail::field(j, "node")}, {"workers", detail::array_field(j, "workers")}});
    return detail::render_workers(j);
  });
}

Outcome<std::string> rebalance(const Options& o, const NodeApi& api) {
  return fetch_and(api, "POST", "/rebalance", [&](const json& j) -> Outcome<std::string> {
    return o.json ? pretty(j) : detail::render_rebalance(j);
  });
}

Outcome<std::string> entity(const Options& o, const NodeApi& api) {
  if (o.type.empty() || o.id.empty()) return usage("entity: TYPE and ID must not be empty");
  std::string path = "/entities/" + detail::percent_encode(o.type) + "/" + detail::percent_encode(o.id);
  return fetch_and(api, "GET", path, [&](const json& j) -> Outcome<std::string> {
    return o.json ? pretty(j) : detail::render_entity(j);
  });
}

// The admin URL a member advertises, usable from here: a node listening on
// every interface advertises 0.0.0.0 (or ::), which means "my own address",
// so that is taken from the member's cluster address instead.
std::string reachable_admin(const json& member) {
  std::string admin = detail::cell(member, "admin");
  auto parsed = detail::parse_node_url(admin);
  if (!parsed.ok() || (parsed->host != "0.0.0.0" && parsed->host != "::")) return admin;
  std::string address = detail::cell(member, "address");
  auto colon = address.rfind(':');
  if (address == "—" || colon == std::string::npos || colon == 0) return admin;
  std::string host = address.substr(0, colon);  // "[::1]" stays bracketed, as a URL wants it
  return "http://" + host + ":" + std::to_string(parsed->port) + parsed->prefix;
}

Outcome<std::string> drain(const Options& o, const NodeApi& api, double timeout_s) {
  std::optional<NodeApi> other;
  if (!o.drain_node.empty()) {
    auto doc = api.call("GET", "/api/overview");
    if (auto* f = std::get_if<Failure>(&doc)) return *f;
    const json& ov = std::get<json>(doc);
    const json* member = nullptr;
    std::vector<std::string> ids;
    for (const auto& m : detail::array_field(ov, "members")) {
      ids.push_back(detail::cell(m, "id"));
      if (detail::field(m, "id") == o.drain_node) member = &m;
    }
    if (!member)
      return Failure{exit_node_error, "'" + o.drain_node + "' is not a member (" + detail::cell(ov, "node") +
                                          " sees: " + join(ids) + ")"};
    const json& self = detail::field(*member, "self");
    if (!(self.is_boolean() && self.get<bool>())) {
      // Only the node itself is sure to know its admin URL; a member that
      // does not advertise one has to be drained at its own address.
      if (!detail::field(*member, "admin").is_string())
        return Failure{exit_node_error, detail::cell(ov, "node") + " does not know the admin URL of '" +
                                            o.drain_node + "': run troupectl --node <its admin URL> drain"};
      auto at = NodeApi::at(reachable_admin(*member), timeout_s);
      if (auto* f = std::get_if<Failure>(&at)) return *f;
      other.emplace(std::move(std::get<NodeApi>(at)));
    }
  }
  const NodeApi& target = other ? *other : api;
  return fetch_and(target, "POST", "/drain", [&](const json& j) -> Outcome<std::string> {
    if (o.json) return pretty(j);
    const json& already = detail::field(j, "already");
    std::string who = detail::cell(j, "node");
    if (already.is_boolean() && already.get<bool>()) return "node " + who + " was already draining\n";
    return "node " + who +
           " is draining: /ready answers 503 from now on, and it stops once its work is handed over\n";
  });
}

}  // namespace

int run(const Options& o, std::ostream& out, std::ostream& err) {
  const double timeout_s = o.timeout_s.value_or(o.command == Command::rebalance ? 60.0 : 10.0);
  Outcome<std::string> result = Failure{};
  if (!(timeout_s > 0)) {
    result = usage("--timeout-s must be positive");
  } else if (auto api = NodeApi::at(o.node, timeout_s); auto* f = std::get_if<Failure>(&api)) {
    result = *f;
  } else {
    const NodeApi& node = std::get<NodeApi>(api);
    switch (o.command) {
      case Command::status:
        result = status(o, node);
        break;
      case Command::members:
        result = members(o, node);
        break;
      case Command::shards:
        result = shards(o, node);
        break;
      case Command::workers:
        result = workers(o, node);
        break;
      case Command::rebalance:
        result = rebalance(o, node);
        break;
      case Command::drain:
        result = drain(o, node, timeout_s);
        break;
      case Command::entity:
        result = entity(o, node);
        break;
    }
  }
  if (auto* f = std::get_if<Failure>(&result)) {
    err << "troupectl: " << f->message << '\n';
    return f->exit_code;
  }
  out << std::get<std::string>(result);
  return exit_ok;
}

int run_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  Options o;
  double timeout_s = 0;
  CLI::App app{"Looks at and steers a running troupe node through its admin HTTP API.", "troupectl"};
  // Global options may also follow the command: troupectl members --json.
  app.fallthrough();
  app.require_subcommand(1);
  app.set_version_flag("--version", "troupectl 0.1.0");
  app.footer(
      "Exit codes: 0 ok; 1 the node answered with an error (or the member or type asked for is not there);\n"
      "2 the node could not be reached or answered too late, or bad usage.");
  app.add_option("--node", o.node, "the node's admin API, http://host:port")
      ->envname("TROUPE_NODE")
      ->capture_default_str();
  app.add_flag("--json", o.json,
               "print JSON (the node's document, or what the table shows) instead of a table");
  auto* timeout =
      app.add_option("--timeout-s", timeout_s, "seconds to wait for each answer [10; rebalance: 60]")
          ->check(CLI::PositiveNumber);

  struct Sub {
    const char* name;
    const char* help;
    Command command;
  };
  const Sub subs[] = {
      {"status", "the node: mode, state, health, uptime, entity types, counters, patterns", Command::status},
      {"members", "the members of the cluster and their load", Command::members},
      {"shards", "which member owns which shards, per entity type", Command::shards},
      {"workers", "which member runs which worker of each worker group", Command::workers},
      {"rebalance", "spread the shards evenly over the live members (cluster only)", Command::rebalance},
      {"drain", "make a node leave gracefully: stop taking work, hand over its shards, stop", Command::drain},
      {"entity", "one entity: its state and whether it is in a processing episode", Command::entity},
  };
  for (const auto& s : subs) {
    auto* sub = app.add_subcommand(s.name, s.help);
    Command c = s.command;
    sub->callback([&o, c] { o.command = c; });
    if (c == Command::shards) sub->add_option("--type", o.type, "only this entity type");
    if (c == Command::drain)
      sub->add_option("NODE", o.drain_node, "the member to drain, by id (default: the node at --node)");
    if (c == Command::entity) {
      sub->add_option("TYPE", o.type, "the entity type")->required();
      sub->add_option("ID", o.id, "the entity id")->required();
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports a misspelt command as "a subcommand is required"; name it.
    if (app.get_subcommands().empty() && !app.remaining().empty() && e.get_exit_code() != 0) {
      err << "troupectl: unknown command '" << app.remaining().front()
          << "' (commands: status, members, shards, workers, rebalance, drain, entity)\n"
          << "Run with --help for more information.\n";
      return exit_unreachable_or_usage;
    }
    int code = app.exit(e, out, err);
    return code == 0 ? exit_ok : exit_unreachable_or_usage;
  }
  if (timeout->count() > 0) o.timeout_s = timeout_s;
  return run(o, out, err);
}

}  // namespace troupe::ctl
