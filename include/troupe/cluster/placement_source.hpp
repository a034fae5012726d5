#pragma once
// Desired sets: which placement units a group should have, and each one's
// spec (SPEC W1). A manager reads one from a DesiredSource at start and every
// sync interval and makes Redis match it (Coordinator::sync).
//
// The text format, shared by files and HTTP bodies: one unit per line,
// "<unit> <spec...>"; the unit is the first word, the spec is the rest of
// the line with surrounding blanks removed (it may be empty or contain
// blanks). Blank lines and lines whose first non-blank character is '#' are
// skipped. A unit named twice, or a unit that breaks validate_unit, is an
// error naming the line.
//
//   # workers of the device fleet
//   device-17  {"model":"m2","rate":5}
//   device-18  {"model":"m3"}
//
// Names:
//   - a group is 1 to 128 characters of [A-Za-z0-9._/-] ("workers",
//     "shards/payment"): it becomes part of Redis key names;
//   - a unit is 1 to 512 bytes, none of them blank or a control character
//     (a worker id, a shard id such as "shard/payment/17").

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"

namespace troupe::cluster {

inline constexpr std::size_t max_group_length = 128;
inline constexpr std::size_t max_unit_length = 512;

// Ok, or invalid_argument saying what is wrong.
Result<void> validate_group(std::string_view group);
Result<void> validate_unit(std::string_view unit);

// unit -> spec.
using DesiredSet = std::map<std::string, std::string>;

// Returns the desired set, or an error (which makes a sync change nothing:
// a source that fails never empties a group). Sources run on a thread of
// their own, never on the coordinator's, so they may block (read a file,
// make a request), but each call should be bounded in time.
using DesiredSource = std::function<Result<DesiredSet>()>;

// Parses the text format above. `origin` names the text in error messages
// ("units.txt", "http://host/units"): "units.txt line 7: ...".
Result<DesiredSet> parse_desired_set(std::string_view text, std::string_view origin);

// Reads `path` on every call. A missing or unreadable file is
// invalid_argument naming the path and the reason.
DesiredSource from_file(std::string path);

// GETs `url` (plain http://host[:port]/path, no TLS) on every call, with
// the network layer's HTTP client (troupe/net/http.hpp), within `timeout`
// for the whole exchange. Errors: invalid_argument for a URL it cannot use
// or a body that does not parse; unreachable for a failed connection or a
// status other than 200 (naming the URL and the status); timeout when the
// exchange takes longer.
DesiredSource from_http(std::string url, Duration timeout = std::chrono::seconds(5));

}  // namespace troupe::cluster
