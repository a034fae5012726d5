#pragma once
// The two parsers behind from_http() (placement_source.hpp): the URL it is
// given and the HTTP response a server sends back. Pure functions over
// text, internal to src/cluster/redis/ (and its fuzz target); safe from
// any thread.

#include <string>
#include <string_view>

#include "troupe/core/result.hpp"

namespace troupe::cluster::detail {

// http://host[:port]/path, the host possibly an [IPv6] literal.
struct Url {
  std::string host;
  std::string port = "80";
  std::string target = "/";
};
// invalid_argument for anything else (no scheme, credentials, bad port).
Result<Url> parse_url(const std::string& url);

// The body of a complete HTTP/1.x response (Content-Length, chunked or
// until the end), or an error naming `url`: unreachable for something that
// is not a 200 response, invalid_argument for a malformed body.
Result<std::string> parse_http_response(std::string_view response, const std::string& url);

}  // namespace troupe::cluster::detail
