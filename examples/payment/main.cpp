// The payment demo: thousands of payments settled through a flaky gateway,
// event-sourced on the SQLite journal, with the payment service killed
// mid-run and restarted from its journal.
//
// Two actor systems share the process:
//  - the *payment service*: the payment entities (payment.hpp) in an
//    EntityRegistry over a SqliteJournal. This is what the crash kills;
//  - the *outside world*: the settlement gateway (gateway.hpp) and the
//    checkout, the client that submits payments and waits for their
//    outcome. They survive the crash, as a gateway and a shop would.
// At the end every payment's final state is read back through the registry
// and checked against what the client was told.
//
// Run it with ./scripts/demo (see README.md); --help lists the flags.
//
// This file wires the run together and reports it; the parts live beside
// it: demo_options.cpp (the flags), demo_service.cpp (the payment service
// and its journal files), demo_checkout.cpp (the client) and
// demo_output.cpp (the progress line and the summary's arithmetic).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "demo.hpp"
#include "demo_checkout.hpp"
#include "demo_output.hpp"
#include "demo_service.hpp"
#include "gateway.hpp"
#include "payment.hpp"

namespace payment_demo {

namespace {

using namespace std::chrono_literals;
using payment::Failure;
using payment::Phase;

// The whole run: the crash and restart, then every payment read back and
// checked. The exit code: 0 when every check passed.
int run(const Options& o) {
  using PL = ProgressLine;
  auto t0 = Steady::now();
  JournalFiles files(o.db);
  const std::string& db = files.db();

  std::printf("troupe payment demo\n");
  std::printf("  %llu payments, %llu in flight at a time, %.1f%% cancelled by the client\n", PL::ull(o.payments),
              PL::ull(o.concurrency), o.cancel_rate * 100);
  std::printf("  gateway: %g ms +- %g ms, %.1f%% declined, %.1f%% never answer; processing timeout %llu ms\n",
              o.latency_ms, o.jitter_ms, o.error_rate * 100, o.hang_rate * 100, PL::ull(o.timeout_ms));
  std::printf("  journal: SQLite, Durability::full, %s\n", db.c_str());
  // Killed once, around half way (a single payment has no half way).
  const bool crash = o.crash && o.payments >= 2;
  const std::uint64_t crash_at = o.payments / 2;
  if (crash) {
    std::printf("  the payment service is killed after %llu payments and restarted %llu ms later\n",
                PL::ull(crash_at), PL::ull(o.downtime_ms));
  }
  std::printf("\n");
  std::fflush(stdout);

  // The outside world: gateway and client. It outlives the crash.
  troupe::SystemConfig outside_cfg;
  outside_cfg.threads = 1;
  troupe::ActorSystem outside(outside_cfg);
  auto gateway_counters = std::make_shared<payment::GatewayCounters>();
  payment::GatewaySettings gw;
  gw.latency_mean = std::chrono::duration_cast<troupe::Duration>(std::chrono::duration<double, std::milli>(o.latency_ms));
  gw.latency_jitter = std::chrono::duration_cast<troupe::Duration>(std::chrono::duration<double, std::milli>(o.jitter_ms));
  gw.decline_rate = o.error_rate;
  gw.hang_rate = o.hang_rate;
  gw.seed = o.seed + 1;
  auto gateway = outside.spawn<payment::SettlementGateway>(troupe::SpawnOptions{.name = "gateway"}, gw, gateway_counters);

  auto refunds = std::make_shared<RefundOffice>();
  auto service = PaymentService::start(o, db, gateway, refunds);
  auto progress = std::make_shared<Progress>();
  auto checkout = spawn_checkout(outside, o, progress);
  checkout.tell(Start{service->registry()});

  PL line(*progress, o.payments);
  troupe::EntityStats runtime{};
  bool crashed = false;
  // A run that stops moving for this long is reported, not waited on forever.
  const auto stall_limit = std::chrono::milliseconds(2 * o.timeout_ms) + 30s;
  std::uint64_t last_done = 0;
  auto last_move = Steady::now();
  for (;;) {
    std::this_thread::sleep_for(100ms);
    std::uint64_t done = progress->done.load();
    line.tick();
    if (done == o.payments) break;
    if (done != last_done) {
      last_done = done;
      last_move = Steady::now();
    } else if (Steady::now() - last_move > stall_limit) {
      line.break_line();
      std::printf("no payment finished for %lld s: giving up (journal kept at %s)\n",
                  static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(stall_limit).count()),
                  db.c_str());
      std::fflush(stdout);
      std::_Exit(1);  // the service may be wedged: do not wait for it to stop
    }
    if (crash && !crashed && done >= crash_at) {
      crashed = true;
      // The client stops submitting while the service is down (as a load
      // balancer would); the payments already in flight see the crash.
      auto paused = outside.ask<std::uint64_t>(
          checkout, [](troupe::ReplyTo<std::uint64_t> r) { return Pause{std::move(r)}; }, 10s).get();
      // Not paused: the client goes on submitting into the crash, and those
      // payments fail as the ones in flight do. Say so; the run stays valid.
      if (!paused.ok()) std::fprintf(stderr, "payment_demo: the client did not pause: %s\n", paused.error().to_string().c_str());
      line.tick("CRASH");
      line.break_line();
      auto k0 = Steady::now();
      add(runtime, service->kill());
      service.reset();
      std::printf("*** the payment service was killed: registry abandoned, actor system and journal destroyed\n"
                  "    without any graceful stop (%.0f ms); the requests in flight fail\n",
                  ms_between(k0, Steady::now()));
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(o.downtime_ms));
      service = PaymentService::start(o, db, gateway, refunds);
      std::printf("*** restarted %llu ms later: journal reopened, new actor system and registry; the client asks\n"
                  "    the payments that were in flight for their status, which recovers them from the journal\n",
                  PL::ull(o.downtime_ms));
      std::fflush(stdout);
      checkout.tell(Resume{service->registry()});
    }
  }
  line.break_line();

  // What the client saw, then what the journal says, payment by payment.
  auto rep = outside.ask<ClientReport>(
      checkout, [](troupe::ReplyTo<ClientReport> r) { return GetReport{std::move(r)}; }, 30s).get();
  if (!rep.ok()) throw std::runtime_error("no report from the checkout: " + rep.error().to_string());
  ClientReport& report = *rep;
  auto q0 = Steady::now();
  std::vector<troupe::Future<PaymentStatus>> queries;
  queries.reserve(o.payments);
  auto id_of = [](std::uint64_t i) {
    char id[32];
    std::snprintf(id, sizeof id, "pay-%06llu", PL::ull(i + 1));
    return std::string(id);
  };
  for (std::uint64_t i = 0; i < o.payments; ++i) {
    queries.push_back(service->registry().ask<PaymentStatus>(
        id_of(i), [](troupe::ReplyTo<PaymentStatus> r) { return payment::GetStatus{std::move(r)}; }, 30s));
  }
  std::uint64_t completed = 0, declined = 0, gateway_errors = 0, timed_out = 0, cancelled = 0, refunded = 0,
                settling = 0, waiting = 0, unreadable = 0, mismatched = 0, bad_logs = 0, events = 0;
  std::vector<std::string> refunded_ids;
  for (std::uint64_t i = 0; i < o.payments; ++i) {
    auto r = queries[i].get();
    if (!r.ok()) {
      ++unreadable;
      if (unreadable <= 3) std::printf("  pay-%06llu: %s\n", PL::ull(i + 1), r.error().to_string().c_str());
      continue;
    }
    const auto& s = r->state;
    events += r->events;
    switch (s.phase) {
      case Phase::completed: ++completed; break;
      case Phase::cancelled:
        ++cancelled;
        if (s.refunded > 0) {
          ++refunded;
          refunded_ids.push_back(id_of(i));
        }
        break;
      case Phase::settling: ++settling; break;
      case Phase::waiting_for_request: ++waiting; break;
      case Phase::failed:
        if (s.failure == Failure::declined) ++declined;
        else if (s.failure == Failure::timed_out) ++timed_out;
        else ++gateway_errors;
        break;
    }
    if (r->events != expected_events(s)) ++bad_logs;
    const auto& told = report.told[i];
    if (!told || told->state.phase != s.phase || told->state.failure != s.failure) ++mismatched;
  }
  double query_ms = ms_between(q0, Steady::now());
  // The refunds are paid back after the cancels were answered: wait (a
  // little) for the outbox to be empty, then check them payment by payment.
  const auto r0 = Steady::now();
  std::uint64_t refunds_left = service->refunds_pending();
  while (refunds_left != 0 && Steady::now() - r0 < 30s) {
    std::this_thread::sleep_for(50ms);
    refunds_left = service->refunds_pending();
  }
  const auto paid = refunds->paid();
  std::uint64_t refunds_missing = 0, refunded_twice = 0;
  for (const auto& id : refunded_ids) {
    auto it = paid.find(id);
    if (it == paid.end()) ++refunds_missing;
    else if (it->second > 1) ++refunded_twice;
  }
  add(runtime, service->stop());
  service.reset();
  outside.shutdown();
  double wall_s = std::chrono::duration<double>(Steady::now() - t0).count();

  auto row = [](const char* name, std::uint64_t n, const std::string& note = {}) {
    std::printf("  %-28s %7llu%s%s\n", name, PL::ull(n), note.empty() ? "" : "   ", note.c_str());
  };
  auto more = [](const std::string& note) { std::printf("  %-28s %7s   %s\n", "", "", note.c_str()); };
  auto text = [](const char* name, const std::string& t) { std::printf("  %-28s %s\n", name, t.c_str()); };
  auto fmt = [](const char* f, auto... a) {
    char b[256];
    std::snprintf(b, sizeof b, f, a...);
    return std::string(b);
  };
  if (crash) {
    std::printf("\nthe crash\n");
    std::string errors;
    for (auto& [code, n] : report.failed_asks) errors += fmt("%s%llu %s", errors.empty() ? "" : ", ", PL::ull(n), code.c_str());
    row("in flight when killed", report.caught_in_crash, errors.empty() ? "" : "their asks failed: " + errors);
    row("recovered in Settling", report.recovered_in_settling, "the status query recovered them mid-episode;");
    if (!report.wait_after_recovery_ms.empty()) {
      more(fmt("they had been accepted %.0f ms before (on average) and timed", mean(report.age_at_recovery_ms)));
      more(fmt("out %.0f ms after recovery (max %.0f): the %llu ms deadline counts",
               mean(report.wait_after_recovery_ms),
               *std::max_element(report.wait_after_recovery_ms.begin(), report.wait_after_recovery_ms.end()),
               PL::ull(o.timeout_ms)));
      more("from the stored SettlementAccepted, not from the restart");
    }
    row("had finished, answer lost", report.finished_unseen, "the status query found the stored outcome");
    row("never reached the journal", report.never_stored, "submitted again");
  }

  std::printf("\nsummary\n");
  row("payments", o.payments);
  row("completed", completed);
  row("failed (declined)", declined);
  if (gateway_errors) row("failed (gateway error)", gateway_errors);
  row("timed out", timed_out,
      fmt("no gateway answer within %llu ms (it hung %llu requests)", PL::ull(o.timeout_ms),
          PL::ull(gateway_counters->hung.load())));
  row("cancelled", cancelled, fmt("%llu of them refunded after completion", PL::ull(refunded)));
  row("refunds paid back", paid.size(),
      fmt("by the outbox, once per key: %llu missing, %llu paid twice, %llu repeats dropped", PL::ull(refunds_missing),
          PL::ull(refunded_twice), PL::ull(refunds->repeated())));
  if (crash) row("recovered after the crash", report.recovered_in_settling, "in Settling, then timed out");
  row("journal events written", events,
      fmt("%.2f per payment, each log checked against its outcome", static_cast<double>(events) /
                                                                         static_cast<double>(o.payments)));
  auto& lat = report.settle_latency_ms;
  text("client latency, Settle",
       fmt("p50 %.1f ms, p99 %.1f ms, max %.1f ms (%zu answers)", percentile(lat, 0.50), percentile(lat, 0.99),
           lat.empty() ? 0.0 : *std::max_element(lat.begin(), lat.end()), lat.size()));
  text("entity runtime", fmt("%llu incarnations (each recovers from the journal), %llu passivated,",
                             PL::ull(runtime.incarnations_started), PL::ull(runtime.passivations)));
  text("", fmt("%llu processing timeouts, %llu missing replies, %llu handler failures,",
               PL::ull(runtime.processing_timeouts), PL::ull(runtime.missing_replies),
               PL::ull(runtime.handler_failures)));
  text("", fmt("%llu journal failures", PL::ull(runtime.journal_failures + runtime.journal_conflicts)));
  text("final status queries", fmt("%.0f ms (every payment read back through the registry)", query_ms));
  text("wall time", fmt("%.1f s", wall_s));

  // The checks: each failing one makes the exit code non-zero.
  std::uint64_t terminal = completed + declined + gateway_errors + timed_out + cancelled;
  std::vector<std::string> problems;
  if (settling || waiting || unreadable)
    problems.push_back(fmt("%llu stuck in Settling, %llu never settled, %llu unreadable", PL::ull(settling),
                           PL::ull(waiting), PL::ull(unreadable)));
  if (terminal != o.payments)
    problems.push_back(fmt("the outcomes add up to %llu, not %llu", PL::ull(terminal), PL::ull(o.payments)));
  if (mismatched) problems.push_back(fmt("%llu final states differ from what the client was told", PL::ull(mismatched)));
  if (bad_logs) problems.push_back(fmt("%llu logs do not hold the events of their outcome", PL::ull(bad_logs)));
  if (refunds_missing || refunded_twice || paid.size() != refunded)
    problems.push_back(fmt("refunds: %llu of %llu not paid back, %llu paid twice, %zu paid in all", PL::ull(refunds_missing),
                           PL::ull(refunded), PL::ull(refunded_twice), paid.size()));
  if (report.recovered_not_timed_out)
    problems.push_back(fmt("%llu payments recovered in Settling did not time out", PL::ull(report.recovered_not_timed_out)));
  if (runtime.missing_replies || runtime.handler_failures || runtime.recovery_failures || runtime.journal_failures)
    problems.push_back("the entity runtime reported failures (see above)");

  std::printf("\n");
  if (problems.empty()) {
    std::printf("check: OK - all %llu payments ended in a terminal state (none stuck in Settling), the outcomes add\n"
                "       up, every outcome the client was told matches the journal, and every refund was paid\n"
                "       back once\n",
                PL::ull(o.payments));
  } else {
    for (auto& p : problems) std::printf("check: FAILED - %s\n", p.c_str());
  }

  if (o.keep_db || !problems.empty()) {
    files.keep();
    std::printf("journal kept at %s\n", db.c_str());
  }
  std::fflush(stdout);
  return problems.empty() ? 0 : 1;
}

}  // namespace

}  // namespace payment_demo

int main(int argc, char** argv) {
  std::optional<payment_demo::Options> o;
  try {
    o = payment_demo::parse_options(argc, argv);
  } catch (const payment_demo::UsageError& e) {
    std::fprintf(stderr, "payment_demo: %s\nrun 'payment_demo --help' for the flags\n", e.what());
    return 2;
  }
  if (!o) {
    std::fputs(payment_demo::kUsage, stdout);
    return 0;
  }
  try {
    return payment_demo::run(*o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "payment_demo: %s\n", e.what());
    return 1;
  }
}
