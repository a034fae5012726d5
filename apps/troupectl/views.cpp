// troupectl's views: the admin API's JSON documents as aligned text tables
// (status, members, shards, workers, job workers, a rebalance's moves, one
// entity), and
// the text helpers they share. See commands.hpp.
//
// The JSON shapes read here are the admin API's, as Node::overview(),
// Node::cluster_view() and the routes in src/node/admin_routes.cpp build
// them. Every field is read defensively (absent, null or of another type
// shows as "—"), so a node of another version still gets a readable table
// rather than an exception.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>
#include <utility>

#include "commands.hpp"
#include "json_fields.hpp"

namespace troupe::ctl {

using json = nlohmann::json;

namespace detail {

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

}  // namespace

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

namespace {

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
    rows.push_back({cell(m, "id"), cell(m, "address"), cell(m, "app_version"), cell(m, "alive"), cell(m, "self"),
                    cell(m, "draining"), cell(m, "shards"), cell(m, "entities_active"), cell(m, "mailbox_depth"),
                    cell(m, "messages_per_s")});
  if (rows.empty()) return "no members\n";
  return format_table(
      {"ID", "ADDRESS", "VERSION", "ALIVE", "SELF", "DRAINING", "SHARDS", "ENTITIES", "MAILBOX", "MSG/S"}, rows);
}

std::string render_workers(const json& c) {
  // Ages on the node's clock: its time_ms less each unit's since.
  const auto now = int_field(c, "time_ms");
  std::vector<std::vector<std::string>> rows;
  std::set<std::string> groups;
  for (const auto& w : array_field(c, "workers")) {
    const auto since = int_field(w, "since");
    std::string age = "—";
    if (now && since) age = format_duration(static_cast<double>(std::max<std::int64_t>(0, *now - *since)) / 1000.0);
    std::string owner = cell(w, "owner");
    if (field(w, "handing_off_from").is_string()) owner += " (from " + cell(w, "handing_off_from") + ")";
    rows.push_back({cell(w, "group"), cell(w, "unit"), owner, cell(w, "epoch"), age});
    groups.insert(cell(w, "group"));
  }
  std::string out;
  if (rows.empty()) {
    out = cell(c, "mode") == "single" ? "no worker units: this node runs alone (no [cluster] in its config)\n"
                                      : "no worker units: no worker group has units in Redis\n";
  } else {
    out = format_table({"GROUP", "UNIT", "OWNER", "EPOCH", "AGE"}, rows);
    out += std::to_string(rows.size()) + (rows.size() == 1 ? " unit in " : " units in ") +
           std::to_string(groups.size()) + (groups.size() == 1 ? " group\n" : " groups\n");
  }
  // The last read from Redis failed: these are the units read before it.
  if (field(c, "workers_error").is_string()) out += "not current: " + cell(c, "workers_error") + "\n";
  return out;
}

std::string render_job_workers(const json& c) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& w : array_field(c, "job_workers"))
    rows.push_back({cell(w, "service"), cell(w, "slot"), cell(w, "state"), cell(w, "owner")});
  if (rows.empty()) return "no job workers: this node runs no job service\n";
  return format_table({"SERVICE", "SLOT", "STATE", "OWNER"}, rows);
}

std::string render_rebalance(const json& r) {
  const json& moved = array_field(r, "moved");
  // Waiting for a rolling update to finish: the node says why and which
  // versions are live.
  std::string waits;
  if (cell(r, "outcome") == "versions_mixed") waits = cell(r, "message") + "\n";
  if (moved.empty()) return waits.empty() ? "nothing moved: the shards are already balanced\n" : waits;
  std::vector<std::vector<std::string>> rows;
  for (const auto& m : moved)
    rows.push_back({cell(m, "type"), cell(m, "shard"), cell(m, "from"), cell(m, "to"), cell(m, "epoch")});
  std::string out = "moved " + std::to_string(moved.size()) + (moved.size() == 1 ? " shard\n" : " shards\n");
  return out + format_table({"TYPE", "SHARD", "FROM", "TO", "EPOCH"}, rows) + waits;
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

}  // namespace troupe::ctl
