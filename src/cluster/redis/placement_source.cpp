// Desired-set sources: the text format, files, and plain HTTP GET.

#include "troupe/cluster/placement_source.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "troupe/net/http.hpp"
#include "troupe/net/url.hpp"

namespace troupe::cluster {

namespace {

bool blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<void> validate_group(std::string_view group) {
  if (group.empty()) return Error(ErrorCode::invalid_argument, "group name is empty");
  if (group.size() > max_group_length)
    return Error(ErrorCode::invalid_argument, "group name is " + std::to_string(group.size()) +
                                                  " characters long; at most " +
                                                  std::to_string(max_group_length) + " allowed");
  for (std::size_t i = 0; i < group.size(); ++i) {
    char c = group[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-' || c == '/';
    if (!ok)
      return Error(ErrorCode::invalid_argument, "group name '" + std::string(group) +
                                                    "' has a character outside [A-Za-z0-9._/-] at " +
                                                    std::to_string(i));
  }
  return {};
}

Result<void> validate_unit(std::string_view unit) {
  if (unit.empty()) return Error(ErrorCode::invalid_argument, "unit name is empty");
  if (unit.size() > max_unit_length)
    return Error(ErrorCode::invalid_argument, "unit name is " + std::to_string(unit.size()) +
                                                  " bytes long; at most " + std::to_string(max_unit_length) +
                                                  " allowed");
  for (std::size_t i = 0; i < unit.size(); ++i) {
    auto c = static_cast<unsigned char>(unit[i]);
    if (c <= 0x20 || c == 0x7f)
      return Error(ErrorCode::invalid_argument, "unit name '" + std::string(unit.substr(0, 64)) +
                                                    "' has a blank or control character at " +
                                                    std::to_string(i));
  }
  return {};
}

Result<DesiredSet> parse_desired_set(std::string_view text, std::string_view origin) {
  DesiredSet out;
  std::map<std::string, std::size_t, std::less<>> first_line;
  std::size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    line = trim(line);
    if (line.empty() || line.front() == '#') continue;
    std::size_t end = 0;
    while (end < line.size() && !blank(line[end])) ++end;
    std::string_view unit = line.substr(0, end);
    std::string_view spec = trim(line.substr(end));
    auto where = [&] { return std::string(origin) + " line " + std::to_string(line_no) + ": "; };
    if (auto v = validate_unit(unit); !v.ok())
      return Error(ErrorCode::invalid_argument, where() + v.error().message());
    if (auto it = first_line.find(unit); it != first_line.end())
      return Error(ErrorCode::invalid_argument, where() + "unit '" + std::string(unit) +
                                                    "' is listed twice (first on line " +
                                                    std::to_string(it->second) + ")");
    first_line.emplace(std::string(unit), line_no);
    out.emplace(std::string(unit), std::string(spec));
  }
  return out;
}

DesiredSource from_file(std::string path) {
  return [path = std::move(path)]() -> Result<DesiredSet> {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return Error(ErrorCode::invalid_argument,
                   "cannot read the desired set file '" + path + "': " + std::strerror(errno));
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad())
      return Error(ErrorCode::invalid_argument, "cannot read the desired set file '" + path + "'");
    return parse_desired_set(ss.str(), path);
  };
}

// --- HTTP ----------------------------------------------------------------------------

namespace {

// The body of a 200 answer to a GET of `url`, through the network layer's
// client; every error names the URL.
Result<std::string> http_get(const std::string& url, Duration timeout) {
  auto named = [&](ErrorCode code, const std::string& why) { return Error(code, url + ": " + why); };
  auto parsed = http::parse_url(url);
  if (!parsed.ok())
    return named(ErrorCode::invalid_argument, "not a desired set URL (" + parsed.error().message() + ")");
  http::ClientSettings settings;
  settings.host = parsed->host;
  settings.port = parsed->port;
  settings.max_connections = 1;
  settings.connect_timeout = timeout;
  settings.request_timeout = timeout;
  auto client = http::Client::create(std::move(settings));
  // The settings are valid by now: what is left is a host that does not resolve.
  if (!client.ok()) return named(ErrorCode::unreachable, client.error().message());
  http::ClientRequest request;
  request.target = parsed->target;
  request.headers = {{"Accept", "text/plain"}, {"Connection", "close"}, {"User-Agent", "troupe"}};
  auto response = (*client)->request_sync(std::move(request));
  if (!response.ok()) {
    const ErrorCode code = response.error().code();
    // A malformed answer is a body that does not parse, as from_http() promises.
    return named(code == ErrorCode::protocol_error ? ErrorCode::invalid_argument : code, response.error().message());
  }
  if (response->status != 200)
    return named(ErrorCode::unreachable, "HTTP/1.1 " + std::to_string(response->status) + " " +
                                             std::string(http::reason_phrase(response->status)));
  return std::move(response->body);
}

}  // namespace

DesiredSource from_http(std::string url, Duration timeout) {
  return [url = std::move(url), timeout]() -> Result<DesiredSet> {
    auto body = http_get(url, timeout);
    if (!body.ok()) return std::move(body).error();
    return parse_desired_set(*body, url);
  };
}

}  // namespace troupe::cluster
