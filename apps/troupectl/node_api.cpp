// troupectl's client of a node's admin API: see node_api.hpp. One request
// per call over a connection of its own; the transport's errors turned
// into troupectl's one-liners.

#include "node_api.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "json_fields.hpp"
#include "troupe/net/http.hpp"
#include "troupe/net/url.hpp"

namespace troupe::ctl::detail {

using json = nlohmann::json;

std::string seconds_text(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%gs", s);
  return buf;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

namespace {

std::string text_of(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

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

}  // namespace

Outcome<NodeApi> NodeApi::at(std::string url, double timeout_s, const Options& o) {
  while (url.size() > 1 && url.back() == '/') url.pop_back();
  auto parsed = parse_node_url(url);
  if (!parsed.ok()) return usage(parsed.error().message());
  return NodeApi(std::move(url), std::move(*parsed), timeout_s, o.token, o.ca_file);
}

Outcome<std::string> read_token_file(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream all;
  if (in) all << in.rdbuf();
  if (!in || in.bad()) return usage("--token-file: cannot read " + file);
  const std::string text = all.str();
  constexpr const char* kSpace = " \t\r\n\f\v";
  const auto b = text.find_first_not_of(kSpace);
  if (b == std::string::npos) return usage("--token-file: " + file + " holds no token");
  return text.substr(b, text.find_last_not_of(kSpace) - b + 1);
}

Outcome<StatusAnswer> NodeApi::status_of(std::string method, const std::string& path) const {
  auto timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(timeout_s_));
  http::ClientSettings cs;
  cs.host = parsed_.host;
  cs.port = parsed_.port;
  cs.max_connections = 1;
  cs.request_timeout = timeout;
  cs.connect_timeout = std::min<Duration>(timeout, std::chrono::seconds(5));
  cs.tls = parsed_.tls;
  cs.tls_ca_file = ca_file_;
  const std::string where = http::authority(parsed_.host, parsed_.port);
  auto client = http::Client::create(cs);
  if (!client.ok()) return unreachable(reason_of(client.error(), where));
  http::ClientRequest req;
  req.method = std::move(method);
  req.target = parsed_.prefix + path;
  req.headers.emplace_back("Accept", "application/json");
  if (!token_.empty()) req.headers.emplace_back("Authorization", "Bearer " + token_);
  auto resp = (*client)->request_sync(std::move(req));
  if (!resp.ok()) {
    if (resp.error().code() == ErrorCode::timeout)
      return Failure{exit_unreachable_or_usage,
                     "the node at " + url_ + " did not answer within " + seconds_text(timeout_s_)};
    return unreachable(reason_of(resp.error(), where));
  }
  StatusAnswer a;
  a.status = resp->status;
  a.body = json::parse(resp->body, nullptr, false);
  a.text = std::move(resp->body);
  a.content_type = std::move(resp->content_type);
  return a;
}

Outcome<json> NodeApi::call(std::string method, const std::string& path) const {
  auto answer = status_of(std::move(method), path);
  if (auto* f = std::get_if<Failure>(&answer)) return *f;
  return document(std::get<StatusAnswer>(answer));
}

Failure NodeApi::unreachable(const std::string& why) const {
  return {exit_unreachable_or_usage, "cannot reach the node at " + url_ + " (" + why + ")"};
}

Outcome<json> NodeApi::document(const StatusAnswer& r) const {
  const json& body = r.body;
  if (r.status == 401)
    return Failure{exit_unauthorized,
                   token_.empty() ? "the node at " + url_ + " needs an admin token: give --token-file FILE or set TROUPE_TOKEN"
                                  : "the node at " + url_ + " refused the admin token (HTTP 401): check --token-file or "
                                                            "TROUPE_TOKEN against the node's [admin] token_file"};
  if (r.status >= 200 && r.status < 300) {
    if (body.is_discarded())
      return Failure{exit_node_error, "the node at " + url_ + " answered HTTP " + std::to_string(r.status) +
                                          " with a body that is not JSON" +
                                          (r.content_type.empty() ? "" : " (" + r.content_type + ")")};
    return body;
  }
  const json& e = field(body, "error");
  if (e.is_object() && e.contains("message") && e.contains("code")) {
    return Failure{exit_node_error, text_of(e["message"]) + " (" + text_of(e["code"]) + ", HTTP " +
                                        std::to_string(r.status) + ")"};
  }
  // Not a troupe node's error document (a proxy, another server).
  std::string excerpt = r.text.substr(0, 200);
  std::replace(excerpt.begin(), excerpt.end(), '\n', ' ');
  std::replace(excerpt.begin(), excerpt.end(), '\r', ' ');
  return Failure{exit_node_error, "the node at " + url_ + " answered HTTP " + std::to_string(r.status) + " " +
                                      std::string(http::reason_phrase(r.status)) +
                                      (excerpt.empty() ? "" : ": " + excerpt)};
}

std::string reachable_admin(const json& member) {
  std::string admin = cell(member, "admin");
  auto parsed = parse_node_url(admin);
  if (!parsed.ok() || (parsed->host != "0.0.0.0" && parsed->host != "::")) return admin;
  std::string address = cell(member, "address");
  auto colon = address.rfind(':');
  if (address == "—" || colon == std::string::npos || colon == 0) return admin;
  std::string host = address.substr(0, colon);  // "[::1]" stays bracketed, as a URL wants it
  return (parsed->tls ? "https://" : "http://") + host + ":" + std::to_string(parsed->port) + parsed->prefix;
}

}  // namespace troupe::ctl::detail
