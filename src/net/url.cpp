// http:// and https:// URLs: see troupe/net/url.hpp.

#include "troupe/net/url.hpp"

namespace troupe::http {

Result<Url> parse_url(std::string_view url, bool https_too) {
  auto bad = [](std::string why) { return Error(ErrorCode::invalid_argument, std::move(why)); };
  constexpr std::string_view plain = "http://";
  constexpr std::string_view secure = "https://";
  Url out;
  std::string_view rest;
  if (url.substr(0, plain.size()) == plain) {
    rest = url.substr(plain.size());
  } else if (https_too && url.substr(0, secure.size()) == secure) {
    rest = url.substr(secure.size());
    out.tls = true;
    out.port = 443;
  } else {
    if (url.find("://") != std::string_view::npos)
      return bad(https_too ? "only http:// and https:// are supported" : "only http:// is supported");
    return bad(https_too ? "expected http[s]://host[:port][/path]" : "expected http://host[:port][/path]");
  }
  const std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    out.target = std::string(rest.substr(slash));
    out.has_path = true;
  }
  if (authority.find('@') != std::string_view::npos) return bad("no user information allowed");
  std::string_view host = authority;
  std::string_view port;
  bool port_given = false;
  if (!authority.empty() && authority.front() == '[') {  // [v6]:port
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("unclosed '[' in the host");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("expected ':' after the IPv6 address");
      port = after.substr(1);
      port_given = true;
    }
  } else if (const std::size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    port_given = true;
  }
  if (host.empty()) return bad("no host");
  out.host = std::string(host);
  if (port_given) {
    unsigned long p = 0;
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos)
      return bad("the port must be a number from 1 to 65535");
    for (char c : port) p = p * 10 + static_cast<unsigned long>(c - '0');
    if (p < 1 || p > 65535) return bad("the port must be a number from 1 to 65535");
    out.port = static_cast<std::uint16_t>(p);
  }
  return out;
}

std::string authority(std::string_view host, std::uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out.append("[").append(host).append("]");
  } else {
    out.append(host);
  }
  return out.append(":").append(std::to_string(port));
}

std::string percent_encode(std::string_view segment) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(segment.size());
  for (unsigned char c : segment) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
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

}  // namespace troupe::http
