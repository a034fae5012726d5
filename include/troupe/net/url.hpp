#pragma once
// http:// URLs (and https:// where asked) as troupe's programs take them on their command lines
// and in their configuration: http://host[:port][/path][?query], the host a
// name, an IPv4 address or an [IPv6] literal. The one parser every layer
// uses (desired-set sources, troupectl, the payment load generator), so
// each accepts and refuses the same URLs with the same reasons.
//
//   auto url = troupe::http::parse_url("http://[::1]:8081/units?g=a");
//   // url->host == "::1", url->port == 8081, url->target == "/units?g=a"
//
// Thread safety: pure functions over values; call them from any thread.

#include <cstdint>
#include <string>
#include <string_view>

#include "troupe/core/result.hpp"

namespace troupe::http {

// One parsed URL; a plain value.
struct Url {
  std::string host;          // without the brackets of an IPv6 literal
  std::uint16_t port = 80;   // 80 when the URL names none (443 for https)
  std::string target = "/";  // path and query (and fragment) as written; "/" when absent
  bool has_path = false;     // the URL had something after the authority, even just "/"
  bool tls = false;          // https:// (only with parse_url's https_too)
};

// invalid_argument with the reason (not naming the URL: callers say where
// it came from) for anything but http://host[:port][/...]: another or no
// scheme, user information ("user@"), no host, an unclosed '[' or junk
// after ']', a port that is not a number from 1 to 65535. With `https_too`,
// https://host[:port][/...] too (for callers that set ClientSettings::tls
// from Url::tls).
Result<Url> parse_url(std::string_view url, bool https_too = false);

// "host:port", the host bracketed when it is an IPv6 literal: what messages
// and the Host header show.
std::string authority(std::string_view host, std::uint16_t port);

// RFC 3986 percent-encoding of one path segment (an entity id, a payment
// id): everything but ALPHA / DIGIT / "-" / "." / "_" / "~" becomes %XX, so
// "a b/c" -> "a%20b%2Fc".
std::string percent_encode(std::string_view segment);

}  // namespace troupe::http
