// The payment demo's command line: the --help text and the flags' parser,
// which names the flag and the accepted range of a bad value.

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "demo.hpp"

namespace payment_demo {

const char* const kUsage = R"(usage: payment_demo [flags]

Settles payments through a simulated gateway, on the SQLite journal, kills
the payment service once mid-run, restarts it from the journal and checks
that every payment ended in a terminal state.

  --payments N        payments to settle                       (default 20000)
  --concurrency N     payments in flight at once               (default 150)
  --latency-ms X      gateway latency, mean                    (default 20)
  --jitter-ms X       gateway latency, +- uniform jitter       (default 10)
  --error-rate P      share the gateway declines, 0..1         (default 0.05)
  --hang-rate P       share the gateway never answers, 0..1    (default 0.02)
  --cancel-rate P     share the client cancels, 0..1           (default 0.01)
  --timeout-ms N      processing timeout of Settling           (default 1500)
  --downtime-ms N     how long the killed service stays down   (default 1000)
  --db PATH           journal file (must not exist yet)        (default: a temp dir)
  --keep-db           keep the journal file at the end
  --no-crash          do not kill the service mid-run
  --seed N            random seed                              (default 42)
  --help              this text
)";

namespace {

std::uint64_t parse_uint(std::string_view flag, std::string_view text, std::uint64_t lo, std::uint64_t hi) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || v < lo || v > hi)
    throw UsageError(std::string(flag) + ": expected a whole number from " + std::to_string(lo) + " to " +
                     std::to_string(hi) + ", got '" + std::string(text) + "'");
  return v;
}

double parse_double(std::string_view flag, std::string_view text, double lo, double hi) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || !std::isfinite(v) || v < lo ||
      v > hi) {
    char range[64];
    std::snprintf(range, sizeof range, "%g to %g", lo, hi);
    throw UsageError(std::string(flag) + ": expected a number from " + range + ", got '" + std::string(text) + "'");
  }
  return v;
}

}  // namespace

std::optional<Options> parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view flag = arg;
    std::optional<std::string_view> inline_value;
    if (auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      flag = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    }
    auto value = [&]() -> std::string_view {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError(std::string(flag) + ": missing value");
      return argv[++i];
    };
    auto no_value = [&] {
      if (inline_value) throw UsageError(std::string(flag) + ": takes no value");
    };
    if (flag == "--help" || flag == "-h") {
      no_value();
      return std::nullopt;
    } else if (flag == "--payments") {
      o.payments = parse_uint(flag, value(), 1, 10'000'000);
    } else if (flag == "--concurrency") {
      o.concurrency = parse_uint(flag, value(), 1, 100'000);
    } else if (flag == "--latency-ms") {
      o.latency_ms = parse_double(flag, value(), 0, 60'000);
    } else if (flag == "--jitter-ms") {
      o.jitter_ms = parse_double(flag, value(), 0, 60'000);
    } else if (flag == "--error-rate") {
      o.error_rate = parse_double(flag, value(), 0, 1);
    } else if (flag == "--hang-rate") {
      o.hang_rate = parse_double(flag, value(), 0, 1);
    } else if (flag == "--cancel-rate") {
      o.cancel_rate = parse_double(flag, value(), 0, 1);
    } else if (flag == "--timeout-ms") {
      o.timeout_ms = parse_uint(flag, value(), 1, 3'600'000);
    } else if (flag == "--downtime-ms") {
      o.downtime_ms = parse_uint(flag, value(), 0, 3'600'000);
    } else if (flag == "--db") {
      o.db = std::string(value());
      if (o.db.empty()) throw UsageError("--db: empty path");
    } else if (flag == "--keep-db") {
      no_value();
      o.keep_db = true;
    } else if (flag == "--no-crash") {
      no_value();
      o.crash = false;
    } else if (flag == "--seed") {
      o.seed = parse_uint(flag, value(), 0, UINT64_MAX);
    } else {
      throw UsageError("unknown flag '" + std::string(arg) + "'");
    }
  }
  if (o.error_rate + o.hang_rate > 1.0)
    throw UsageError("--error-rate plus --hang-rate must not exceed 1");
  if (o.jitter_ms > o.latency_ms) throw UsageError("--jitter-ms must not exceed --latency-ms");
  if (!o.db.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(o.db, ec))
      throw UsageError("--db: '" + o.db + "' already exists; the demo starts from an empty journal");
    auto parent = std::filesystem::path(o.db).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
      throw UsageError("--db: directory '" + parent.string() + "' does not exist");
  }
  return o;
}

}  // namespace payment_demo
