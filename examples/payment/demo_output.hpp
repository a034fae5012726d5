#pragma once
// The payment demo's output and arithmetic: the progress line it rewrites
// while the payments run, and the helpers of its summary and checks.

#include <cstdint>
#include <deque>
#include <string_view>
#include <utility>
#include <vector>

#include "demo.hpp"
#include "demo_checkout.hpp"

namespace payment_demo {

// The single progress line: rewritten in place on a terminal, a plain line
// every two seconds otherwise. Used by main only.
class ProgressLine {
 public:
  ProgressLine(const Progress& p, std::uint64_t total);

  void tick(std::string_view note = {});
  // Ends the line being rewritten, before other output.
  void break_line();

  static unsigned long long ull(std::uint64_t v) { return static_cast<unsigned long long>(v); }

 private:
  const Progress& p_;
  std::uint64_t total_;
  bool tty_;
  Steady::time_point last_print_{};
  std::deque<std::pair<Steady::time_point, std::uint64_t>> samples_;
};

// The q-quantile of `v` (nearest rank); 0 when empty.
double percentile(std::vector<double> v, double q);
// The mean of `v`; 0 when empty.
double mean(const std::vector<double>& v);
// Adds the counters of `b` to `a` (one service life's to the run's).
void add(troupe::EntityStats& a, const troupe::EntityStats& b);
// Events a payment's log holds for its final state, on the paths this
// driver takes (Settle first, a Cancel only after it).
std::uint64_t expected_events(const payment::PaymentState& s);

}  // namespace payment_demo
