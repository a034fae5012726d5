// Requests and responses: their accessors and helpers. Free of sockets and
// of the Responder, so that the fuzz target links it with the parser alone.

#include <algorithm>
#include <nlohmann/json.hpp>

#include "syntax.hpp"
#include "troupe/net/http.hpp"

namespace troupe::http {

using detail::iequals;

// --- messages ----------------------------------------------------------------------

std::string_view Request::header(std::string_view name) const noexcept {
  return detail::find_field(headers, name);
}

bool Request::has_header(std::string_view name) const noexcept {
  return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return iequals(h.first, name); });
}

std::optional<std::string> Request::query_param(std::string_view name) const {
  std::string_view rest = query;
  std::string key;
  std::string value;
  while (!rest.empty()) {
    const std::size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest.remove_prefix(amp == std::string_view::npos ? rest.size() : amp + 1);
    const std::size_t eq = pair.find('=');
    const std::string_view k = pair.substr(0, eq);
    // A malformed escape is kept as it is rather than losing the parameter.
    if (!detail::percent_decode(k, key, true, true)) key.assign(k);
    if (key != name) continue;
    if (eq == std::string_view::npos) return std::string();
    const std::string_view v = pair.substr(eq + 1);
    if (!detail::percent_decode(v, value, true, true)) value.assign(v);
    return value;
  }
  return std::nullopt;
}

Response Response::json(int status, std::string body) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

Response Response::text(int status, std::string body) {
  Response r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = std::move(body);
  return r;
}

Response Response::error(int status, std::string_view code, std::string_view message) {
  const nlohmann::json j = {{"error", {{"code", code}, {"message", message}}}};
  // Messages quote what a client sent, which need not be UTF-8.
  return json(status, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::string_view Response::header(std::string_view name) const noexcept {
  return detail::find_field(headers, name);
}

std::string_view reason_phrase(int status) noexcept {
  switch (status) {
    case 100:
      return "Continue";
    case 101:
      return "Switching Protocols";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 206:
      return "Partial Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 303:
      return "See Other";
    case 304:
      return "Not Modified";
    case 307:
      return "Temporary Redirect";
    case 308:
      return "Permanent Redirect";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 406:
      return "Not Acceptable";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 411:
      return "Length Required";
    case 412:
      return "Precondition Failed";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 422:
      return "Unprocessable Content";
    case 425:
      return "Too Early";
    case 426:
      return "Upgrade Required";
    case 428:
      return "Precondition Required";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

}  // namespace troupe::http
