// libFuzzer target for the placement values the coordinator reads (scripts/
// fuzz runs it): what Redis holds can be written by another version, an
// operator or a damaged restore, and a desired set comes from a file or an
// HTTP server. Each must read as a value or be refused, never crash, hit
// undefined behaviour (ASan/UBSan), leak or hang.
//
// The first input byte picks the parser, the rest is its input:
//   0  a desired set's text (parse_desired_set)
//   1  the body of a desired-set server's answer, read as a desired set
//      named by its URL (the HTTP framing around it is the network layer's,
//      fuzzed by src/net/http's target)
//   2  a desired-set URL (the network layer's parse_url)
//   3  a Redis reply in RESP, read by hiredis as the connection does
//      (RedisReply::from), then as an assignment (parse_assignment)
//   4  the same, then as a heartbeat's member view (parse_members)
//   5  the same, then each element as text, integer and event words
// Checks beyond "no crash": errors carry a code and a message naming their
// origin; an accepted desired set holds only valid unit names; a member view
// is sorted, with valid ids and ports, none older than the threshold; an
// assignment's owner is a valid node id; a URL has a host and a port in
// 1..65535.

#include <hiredis/hiredis.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "redis_values.hpp"
#include "troupe/cluster/node_id.hpp"
#include "troupe/cluster/placement_source.hpp"
#include "troupe/net/url.hpp"

namespace {

using namespace troupe::cluster;
using troupe::ErrorCode;
using detail::RedisReply;

void check(bool ok) {
  if (!ok) std::abort();
}

void desired_set(std::string_view text, std::string_view origin) {
  auto set = parse_desired_set(text, origin);
  if (!set.ok()) {
    check(set.error().code() == ErrorCode::invalid_argument);
    check(set.error().message().compare(0, origin.size(), origin) == 0);
    return;
  }
  for (const auto& [unit, spec] : *set) {
    check(validate_unit(unit).ok());
    check(spec.find('\n') == std::string::npos);
  }
}

// Whether an array header ("*<n>", anywhere: hiredis skips the two bytes
// after a bulk string without checking them) counts more elements than
// there are bytes. hiredis 0.14 allocates an array's element
// table when it reads the header, before any element: "*399999999" asks
// for 3.2 GB at once. That is the library's behaviour with a reply no
// troupe script returns (the connection's reader cannot bound it in that
// version), not troupe's parsing, so such inputs are left out here.
bool declares_more_elements_than_bytes(std::string_view bytes) {
  for (std::size_t at = 0; at < bytes.size(); ++at) {
    if (bytes[at] != '*') continue;
    std::size_t n = 0, i = at + 1;
    while (i < bytes.size() && bytes[i] >= '0' && bytes[i] <= '9' && n <= bytes.size()) n = n * 10 + (bytes[i++] - '0');
    if (n > bytes.size()) return true;
  }
  return false;
}

// One reply read from RESP bytes as hiredis hands it to the connection;
// false if the bytes are not one complete reply.
bool read_reply(std::string_view bytes, RedisReply& out) {
  if (declares_more_elements_than_bytes(bytes)) return false;
  redisReader* reader = redisReaderCreate();
  check(reader != nullptr);
  void* raw = nullptr;
  bool ok = redisReaderFeed(reader, bytes.data(), bytes.size()) == REDIS_OK &&
            redisReaderGetReply(reader, &raw) == REDIS_OK && raw != nullptr;
  if (ok) out = RedisReply::from(static_cast<redisReply*>(raw));
  if (raw != nullptr) freeReplyObject(raw);
  redisReaderFree(reader);
  return ok;
}

void assignment(const RedisReply& r) {
  auto a = detail::parse_assignment(r, "g", "u");
  if (!a) return;
  check(validate_node_id(a->owner).ok());
  check(a->group == "g" && a->unit == "u");
}

void members(const RedisReply& r) {
  const troupe::Duration threshold = std::chrono::seconds(3);
  auto view = detail::parse_members(r, threshold);
  check(view.live.size() + view.skipped.size() <= r.elements.size() / 3);
  for (std::size_t i = 0; i < view.live.size(); ++i) {
    const Member& m = view.live[i];
    check(validate_node_id(m.id).ok());
    check(m.address.port != 0 && !m.address.host.empty());
    check(m.heartbeat_age <= threshold);
    if (i > 0) check(view.live[i - 1].id <= m.id);
  }
  for (const auto& s : view.skipped) check(!s.why.empty());
}

void values(const RedisReply& r) {
  for (const auto& e : r.elements) {
    std::string text;
    long long n = 0;
    if (detail::text_of(e, text)) {
      for (const auto& w : detail::split_words(text)) check(!w.empty() && w.find(' ') == std::string::npos);
    }
    (void)detail::int_of(e, n);
    (void)e.describe();
  }
  (void)r.describe();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 0:
      desired_set(in, "units.txt");
      break;
    case 1:
      desired_set(in, "http://placement.example/units");
      break;
    case 2: {
      auto u = troupe::http::parse_url(in);
      if (!u.ok()) {
        check(u.error().code() == ErrorCode::invalid_argument && !u.error().message().empty());
        break;
      }
      check(!u->host.empty() && !u->target.empty() && u->target.front() == '/');
      check(u->port >= 1);
      break;
    }
    default: {
      RedisReply r;
      if (!read_reply(in, r)) break;
      if (data[0] % 6 == 3) assignment(r);
      if (data[0] % 6 == 4) members(r);
      if (data[0] % 6 == 5) values(r);
      break;
    }
  }
  return 0;
}
