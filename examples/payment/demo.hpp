#pragma once
// What the payment demo's files share: its command-line options (parsed in
// demo_options.cpp) and the clock helpers of its measurements.

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace payment_demo {

using Steady = std::chrono::steady_clock;

inline double ms_between(Steady::time_point a, Steady::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline std::int64_t wall_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The demo's settings, from its flags (kUsage lists them). Value type.
struct Options {
  std::uint64_t payments = 20000;
  std::uint64_t concurrency = 150;
  double latency_ms = 20;
  double jitter_ms = 10;
  double error_rate = 0.05;
  double hang_rate = 0.02;
  double cancel_rate = 0.01;
  std::uint64_t timeout_ms = 1500;
  std::uint64_t downtime_ms = 1000;
  std::string db;  // empty: a fresh file in a temporary directory
  bool keep_db = false;
  bool crash = true;
  std::uint64_t seed = 42;
};

// The --help text.
extern const char* const kUsage;

// A bad command line: reported in one line, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Options from argv; throws UsageError. Returns nullopt for --help.
std::optional<Options> parse_options(int argc, char** argv);

}  // namespace payment_demo
