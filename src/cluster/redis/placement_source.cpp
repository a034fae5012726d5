// Desired-set sources: the text format, files, and plain HTTP GET.

// clang-format off
#include "../asio_headers.hpp"  // first: see there
// clang-format on
#include "troupe/cluster/placement_source.hpp"
#include "placement_http.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

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

namespace detail {

Result<Url> parse_url(const std::string& url) {
  constexpr std::string_view scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0)
    return Error(ErrorCode::invalid_argument, "desired set URL '" + url + "' is not http://host[:port]/path");
  std::string_view rest = std::string_view(url).substr(scheme.size());
  std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  Url u;
  if (slash != std::string_view::npos) u.target = std::string(rest.substr(slash));
  if (authority.find('@') != std::string_view::npos)
    return Error(ErrorCode::invalid_argument,
                 "desired set URL '" + url + "': credentials in URLs are not supported");
  std::size_t colon = authority.rfind(':');
  if (!authority.empty() && authority.front() == '[') {  // [v6]:port
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos)
      return Error(ErrorCode::invalid_argument, "desired set URL '" + url + "' has an unclosed '['");
    u.host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':')
        return Error(ErrorCode::invalid_argument, "desired set URL '" + url + "' has junk after ']'");
      u.port = std::string(authority.substr(close + 2));
    }
  } else if (colon != std::string_view::npos) {
    u.host = std::string(authority.substr(0, colon));
    u.port = std::string(authority.substr(colon + 1));
  } else {
    u.host = std::string(authority);
  }
  if (u.host.empty()) return Error(ErrorCode::invalid_argument, "desired set URL '" + url + "' has no host");
  if (u.port.empty() || u.port.size() > 5 || u.port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(u.port) == 0 || std::stoi(u.port) > 65535)
    return Error(ErrorCode::invalid_argument,
                 "desired set URL '" + url + "' has a bad port '" + u.port + "'");
  return u;
}

}  // namespace detail

namespace {

std::string lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

Result<std::string> dechunk(std::string_view body, const std::string& url) {
  std::string out;
  while (true) {
    std::size_t eol = body.find("\r\n");
    if (eol == std::string_view::npos)
      return Error(ErrorCode::invalid_argument, url + ": truncated chunked body");
    std::string size_text(body.substr(0, eol));
    if (auto semi = size_text.find(';'); semi != std::string::npos) size_text.resize(semi);
    while (!size_text.empty() && (size_text.back() == ' ' || size_text.back() == '\t')) size_text.pop_back();
    // Hex digits only (std::stoul alone would take "-2" as a huge size and
    // skip blanks), and a size no larger than what is left.
    std::size_t size = 0;
    const bool hex = !size_text.empty() && size_text.size() <= 15 &&
                     size_text.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
    if (!hex) return Error(ErrorCode::invalid_argument, url + ": bad chunk size '" + size_text + "'");
    size = std::stoul(size_text, nullptr, 16);
    body.remove_prefix(eol + 2);
    if (size == 0) return out;
    if (body.size() < 2 || body.size() - 2 < size)
      return Error(ErrorCode::invalid_argument, url + ": truncated chunked body");
    out.append(body.substr(0, size));
    body.remove_prefix(size + 2);
  }
}

constexpr std::size_t kMaxResponseBytes = 64u << 20;

Result<std::string> http_get(const std::string& url, Duration timeout) {
  auto parsed = detail::parse_url(url);
  if (!parsed.ok()) return std::move(parsed).error();
  const detail::Url& u = *parsed;

  asio::io_context io;
  asio::ip::tcp::resolver resolver(io);
  asio::ip::tcp::socket socket(io);
  std::string request = "GET " + u.target + " HTTP/1.1\r\nHost: " + u.host +
                        (u.port == "80" ? "" : ":" + u.port) +
                        "\r\nAccept: text/plain\r\nConnection: close\r\nUser-Agent: troupe\r\n\r\n";
  std::string response;
  std::optional<Error> failure;
  std::array<char, 16384> buf{};

  std::function<void()> read_more = [&] {
    socket.async_read_some(asio::buffer(buf), [&](const asio::error_code& ec, std::size_t n) {
      response.append(buf.data(), n);
      if (response.size() > kMaxResponseBytes) {
        failure = Error(ErrorCode::invalid_argument, url + ": response larger than 64 MiB");
        return;
      }
      if (ec == asio::error::eof) return;
      if (ec) {
        failure = Error(ErrorCode::unreachable, url + ": read failed: " + ec.message());
        return;
      }
      read_more();
    });
  };
  resolver.async_resolve(
      u.host, u.port, [&](const asio::error_code& ec, asio::ip::tcp::resolver::results_type rs) {
        if (ec) {
          failure = Error(ErrorCode::unreachable, url + ": cannot resolve '" + u.host + "': " + ec.message());
          return;
        }
        asio::async_connect(socket, rs, [&](const asio::error_code& cec, const asio::ip::tcp::endpoint&) {
          if (cec) {
            failure = Error(ErrorCode::unreachable,
                            url + ": cannot connect to " + u.host + ":" + u.port + ": " + cec.message());
            return;
          }
          asio::async_write(socket, asio::buffer(request), [&](const asio::error_code& wec, std::size_t) {
            if (wec) {
              failure = Error(ErrorCode::unreachable, url + ": write failed: " + wec.message());
              return;
            }
            read_more();
          });
        });
      });
  io.run_for(std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout));
  if (!io.stopped()) {
    asio::error_code ignored;
    socket.close(ignored);
    resolver.cancel();
    io.run();  // let the cancelled handlers finish: they reference locals
    return Error(ErrorCode::timeout,
                 url + ": no complete answer within " +
                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
                     " ms");
  }
  if (failure) return *failure;
  return detail::parse_http_response(response, url);
}

}  // namespace

namespace detail {

Result<std::string> parse_http_response(std::string_view response, const std::string& url) {
  std::size_t head_end = response.find("\r\n\r\n");
  if (head_end == std::string::npos)
    return Error(ErrorCode::unreachable, url + ": the answer is not an HTTP response");
  std::string_view head(response.data(), head_end);
  std::size_t line_end = head.find("\r\n");
  std::string status_line(head.substr(0, line_end));
  if (status_line.compare(0, 5, "HTTP/") != 0)
    return Error(ErrorCode::unreachable, url + ": the answer is not an HTTP response");
  std::size_t sp = status_line.find(' ');
  if (sp == std::string::npos || status_line.compare(sp + 1, 3, "200") != 0)
    return Error(ErrorCode::unreachable, url + ": " + status_line);
  bool chunked = false;
  std::optional<std::size_t> length;
  std::string_view headers =
      line_end == std::string_view::npos ? std::string_view() : head.substr(line_end + 2);
  while (!headers.empty()) {
    std::size_t e = headers.find("\r\n");
    std::string_view h = headers.substr(0, e);
    headers.remove_prefix(e == std::string_view::npos ? headers.size() : e + 2);
    std::size_t colon = h.find(':');
    if (colon == std::string_view::npos) continue;
    std::string name = lower(std::string(h.substr(0, colon)));
    std::string value = lower(std::string(trim(h.substr(colon + 1))));
    if (name == "transfer-encoding" && value.find("chunked") != std::string::npos) chunked = true;
    if (name == "content-length") {
      try {
        length = std::stoul(value);
      } catch (...) {
        return Error(ErrorCode::invalid_argument, url + ": bad Content-Length '" + value + "'");
      }
    }
  }
  std::string_view body = response.substr(head_end + 4);
  if (chunked) return dechunk(body, url);
  if (length) {
    if (body.size() < *length)
      return Error(ErrorCode::unreachable, url + ": body ended after " + std::to_string(body.size()) +
                                               " of " + std::to_string(*length) + " bytes");
    body = body.substr(0, *length);
  }
  return std::string(body);
}

}  // namespace detail

DesiredSource from_http(std::string url, Duration timeout) {
  return [url = std::move(url), timeout]() -> Result<DesiredSet> {
    auto body = http_get(url, timeout);
    if (!body.ok()) return std::move(body).error();
    return parse_desired_set(*body, url);
  };
}

}  // namespace troupe::cluster
