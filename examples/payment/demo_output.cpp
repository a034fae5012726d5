// The payment demo's output and arithmetic: see demo_output.hpp.

#include "demo_output.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace payment_demo {

using namespace std::chrono_literals;
using payment::Phase;

ProgressLine::ProgressLine(const Progress& p, std::uint64_t total)
    : p_(p), total_(total), tty_(isatty(STDOUT_FILENO) == 1), last_print_(Steady::now()) {}

void ProgressLine::tick(std::string_view note) {
  auto now = Steady::now();
  std::uint64_t done = p_.done.load();
  samples_.emplace_back(now, done);
  while (samples_.size() > 2 && now - samples_.front().first > 1s) samples_.pop_front();
  if (!tty_ && now - last_print_ < 2s && note.empty()) return;
  last_print_ = now;
  double rate = 0;
  if (auto dt = std::chrono::duration<double>(now - samples_.front().first).count(); dt > 0.05)
    rate = static_cast<double>(done - samples_.front().second) / dt;
  std::uint64_t launched = p_.launched.load();
  std::printf("%s  %6llu/%llu done  %4llu in flight  %6.0f payments/s  | %llu completed, %llu declined, "
              "%llu timed out, %llu cancelled%s%.*s%s",
              tty_ ? "\r" : "", ull(done), ull(total_), ull(launched - done), rate, ull(p_.completed.load()),
              ull(p_.declined.load()), ull(p_.timed_out.load()), ull(p_.cancelled.load()), note.empty() ? "" : "  ",
              static_cast<int>(note.size()), note.data(), tty_ ? "\x1b[K" : "\n");
  std::fflush(stdout);
}

void ProgressLine::break_line() {
  if (tty_) std::fputc('\n', stdout);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

void add(troupe::EntityStats& a, const troupe::EntityStats& b) {
  a.incarnations_started += b.incarnations_started;
  a.passivations += b.passivations;
  a.recoveries += b.recoveries;
  a.recovery_failures += b.recovery_failures;
  a.events_persisted += b.events_persisted;
  a.processing_timeouts += b.processing_timeouts;
  a.stale_deadlines += b.stale_deadlines;
  a.stash_overflows += b.stash_overflows;
  a.missing_replies += b.missing_replies;
  a.journal_conflicts += b.journal_conflicts;
  a.journal_failures += b.journal_failures;
  a.handler_failures += b.handler_failures;
}

std::uint64_t expected_events(const payment::PaymentState& s) {
  switch (s.phase) {
    case Phase::completed:
    case Phase::failed:
      return 2;  // SettlementAccepted + the outcome
    case Phase::cancelled:
      // A completed payment cancelled: its settlement's two and
      // PaymentCancelled (its refund is in the outbox, not in the log). One
      // never settled: PaymentCancelled alone.
      return s.refunded == 0 ? 1 : 3;
    case Phase::waiting_for_request:
    case Phase::settling:
      break;
  }
  return 0;
}

}  // namespace payment_demo
