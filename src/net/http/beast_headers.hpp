#pragma once
// Boost.Asio (its OpenSSL stream too) and Boost.Beast as troupe's HTTP code includes them: Boost
// 1.74's headers trip warnings troupe builds with as errors, so they are
// silenced here, around the includes only. Also the short names the HTTP
// files use. Internal to src/net/http/.
//
// Boost.Asio here, standalone Asio in the cluster's transport: the two never
// meet. The HTTP server and client run io_contexts of their own, and nothing
// of Boost shows in troupe/net/http.hpp.

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#pragma GCC diagnostic ignored "-Wtsan"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wold-style-cast"
#endif
#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without it under C++20
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace troupe::http::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using Socket = asio::ip::tcp::socket;
using BeastRequest = bhttp::request<bhttp::string_body>;
using BeastResponse = bhttp::response<bhttp::string_body>;
using BeastRequestParser = bhttp::request_parser<bhttp::string_body>;
using BeastResponseParser = bhttp::response_parser<bhttp::string_body>;

}  // namespace troupe::http::detail
