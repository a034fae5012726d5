// payment_loadgen's driver: the payments sent in a closed or open loop,
// their answers counted and timed, the refunds asked, and the progress
// line on stderr. See loadgen.hpp.

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <thread>

#include "loadgen.hpp"
#include "troupe/net/url.hpp"

namespace payment_loadgen {

namespace {

// The outcome of a request that never found a ready node.
Result<Response> no_ready_node() {
  return troupe::Error(ErrorCode::timeout, "no node was ready within the request's timeout");
}

// What is left of a request's time until `deadline` (at least 1 ms: the
// client takes no zero).
troupe::Duration remaining(Steady::time_point deadline) {
  const auto left = std::chrono::duration_cast<troupe::Duration>(deadline - Steady::now());
  return std::max<troupe::Duration>(left, std::chrono::milliseconds(1));
}

}  // namespace

Result<void> LoadGen::probe() {
  std::optional<troupe::Error> last;
  std::size_t answering = 0;
  for (std::size_t i = 0; i < nodes_->size(); ++i) {
    NodePool::Node& n = nodes_->node(i);
    auto r = n.api->request_sync("GET", "/payments/loadgen-probe", "", "", std::chrono::seconds(5));
    if (r.ok()) {
      ++answering;
      continue;
    }
    if (nodes_->size() > 1)
      std::fprintf(stderr, "payment_loadgen: node %s does not answer: %s\n", n.address.api.c_str(),
                   r.error().to_string().c_str());
    last = r.error();
  }
  if (answering == 0 && last) return *last;
  nodes_->start_polling();
  return {};
}

void LoadGen::run() {
  start_ = Steady::now();
  measure_from_ = start_ + seconds(o_.warmup_s);
  has_deadline_ = o_.duration_s > 0;
  deadline_ = measure_from_ + seconds(o_.duration_s);
  std::thread scheduler;
  if (o_.rate > 0) {
    scheduler = std::thread([this] { open_loop(); });
  } else {
    for (std::size_t i = 0; i < o_.concurrency && may_send(Steady::now()); ++i) send_payment(Steady::now());
  }
  progress_loop();
  const bool reached_deadline = has_deadline_ && Steady::now() >= deadline_;
  const auto stopped_at = reached_deadline ? deadline_ : Steady::now();
  if (scheduler.joinable()) scheduler.join();
  // Whatever is in flight gets its answer or its timeout.
  {
    std::unique_lock lk(idle_mu_);
    idle_cv_.wait_for(lk, seconds(o_.timeout_s + 5), [&] { return in_flight_.load() == 0; });
  }
  nodes_->stop();
  // A run of a given length is measured over that length (answers that
  // come after it were sent within it); a run of --payments N lasts
  // until its last answer.
  const auto last = last_answer_at();
  end_ = !reached_deadline && o_.payments > 0 && last > measure_from_ ? last : stopped_at;
}

bool LoadGen::may_send(Steady::time_point at) {
  if (g_interrupted.load() || stopping_.load()) return false;
  if (has_deadline_ && at >= deadline_) return false;
  if (o_.payments > 0 && counted(at) && counted_sent_.load() >= o_.payments) return false;
  return true;
}

void LoadGen::open_loop() {
  const auto interval = seconds(1.0 / o_.rate);
  std::uint64_t k = 0;
  for (;;) {
    const auto now = Steady::now();
    auto next = start_ + interval * static_cast<std::int64_t>(k);
    while (next <= now) {
      if (!may_send(next)) {
        stopping_.store(true);
        return;
      }
      if (in_flight_.load() >= o_.concurrency) {
        if (counted(next)) t_.behind.fetch_add(1, std::memory_order_relaxed);
      } else {
        send_payment(next);
      }
      ++k;
      next = start_ + interval * static_cast<std::int64_t>(k);
    }
    std::this_thread::sleep_until(std::min(next, now + std::chrono::milliseconds(50)));
  }
}

void LoadGen::send_payment(Steady::time_point scheduled) {
  const bool count = counted(scheduled);
  std::uint64_t seq;
  std::string body;
  {
    std::lock_guard lk(rng_mu_);
    seq = ++seq_;
    std::uniform_int_distribution<std::uint64_t> customer(0, o_.customers - 1);
    std::uniform_int_distribution<std::int64_t> amount(o_.amount_min, o_.amount_max);
    body = json{
        {"customer", "c-" + std::to_string(customer(rng_))},
        {"order_id", o_.id_prefix + "-" + std::to_string(seq)},
        {"amount", amount(rng_)},
        {"settle",
         true}}.dump();
  }
  if (count) {
    t_.sent.fetch_add(1, std::memory_order_relaxed);
    counted_sent_.fetch_add(1);
  }
  in_flight_.fetch_add(1);
  // The timeout covers a wait for a ready node too.
  const auto deadline = deadline_from(Steady::now());
  nodes_->route(deadline, [this, scheduled, count, deadline,
                           body = std::move(body)](std::optional<std::size_t> node) mutable {
    if (!node) {
      on_payment(scheduled, count, node, no_ready_node());
      return;
    }
    NodePool::Node& n = nodes_->node(*node);
    n.payments.fetch_add(1, std::memory_order_relaxed);
    n.api->request(
        "POST", "/payments", std::move(body), "application/json",
        [this, scheduled, count, node](Result<Response> r) {
          on_payment(scheduled, count, node, std::move(r));
        },
        remaining(deadline));
  });
}

void LoadGen::on_payment(Steady::time_point scheduled, bool count, std::optional<std::size_t> node,
                         Result<Response> r) {
  const auto now = Steady::now();
  if (count) {
    note_answer(now);
    payment_answers_.count(r, !node);
    time_request(scheduled, now, node, "payment", r);
  }
  bool follow_up = false;
  if (!r.ok()) {
    if (count) {
      t_.errors.fetch_add(1, std::memory_order_relaxed);
      if (r.error().code() == ErrorCode::timeout) t_.client_timeouts.fetch_add(1, std::memory_order_relaxed);
      note_error("POST /payments: " + r.error().to_string());
    }
  } else if (r->status == 429) {
    if (count) t_.refused.fetch_add(1, std::memory_order_relaxed);
  } else if (r->status != 200 && r->status != 201) {
    if (count) {
      t_.errors.fetch_add(1, std::memory_order_relaxed);
      note_error("POST /payments: HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 200));
    }
  } else {
    const json j = json::parse(r->body, nullptr, false);
    const std::string status = j.is_object() ? j.value("status", std::string()) : std::string();
    if (status.empty()) {
      if (count) {
        t_.errors.fetch_add(1, std::memory_order_relaxed);
        note_error("POST /payments: an answer without a status: " + r->body.substr(0, 200));
      }
    } else {
      all_answers_.fetch_add(1, std::memory_order_relaxed);
      if (count) follow_up = tally_outcome(j, status, now - scheduled);
    }
    const std::string id = follow_up ? j.value("id", std::string()) : std::string();
    if (!id.empty()) {
      // The refund goes on in the payment's slot; it finishes the slot.
      refund(id, j.value("amount", std::int64_t{0}));
      return;
    }
  }
  finished();
}

bool LoadGen::tally_outcome(const json& j, const std::string& status, Steady::duration latency) {
  t_.answered.fetch_add(1, std::memory_order_relaxed);
  latency_.record(latency);
  const std::string failure =
      j.contains("failure") && j["failure"].is_string() ? j["failure"].get<std::string>() : std::string();
  if (status == "Completed") {
    t_.completed.fetch_add(1, std::memory_order_relaxed);
    return draw_refund();
  }
  if (status == "Failed" && failure == "declined")
    t_.declined.fetch_add(1, std::memory_order_relaxed);
  else if (status == "Failed" && failure == "gateway error")
    t_.gateway_error.fetch_add(1, std::memory_order_relaxed);
  else if (status == "Failed" && failure == "timed out")
    t_.timed_out.fetch_add(1, std::memory_order_relaxed);
  else if (status == "Settling" || status == "WaitingForRequest")
    t_.unsettled.fetch_add(1, std::memory_order_relaxed);
  else
    t_.failed_other.fetch_add(1, std::memory_order_relaxed);
  return false;
}

bool LoadGen::draw_refund() {
  if (o_.refund_rate <= 0) return false;
  std::lock_guard lk(rng_mu_);
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < o_.refund_rate;
}

void LoadGen::refund(const std::string& id, std::int64_t amount) {
  t_.refunds_requested.fetch_add(1, std::memory_order_relaxed);
  const auto sent = Steady::now();
  const auto deadline = deadline_from(sent);
  nodes_->route(deadline, [this, id, amount, sent, deadline](std::optional<std::size_t> node) {
    if (!node) {
      on_refund(id, amount, sent, node, no_ready_node());
      return;
    }
    NodePool::Node& n = nodes_->node(*node);
    n.cancels.fetch_add(1, std::memory_order_relaxed);
    n.api->request(
        "POST", "/payments/" + troupe::http::percent_encode(id) + "/cancel", "{}", "application/json",
        [this, id, amount, sent, node](Result<Response> r) {
          on_refund(id, amount, sent, node, std::move(r));
        },
        remaining(deadline));
  });
}

void LoadGen::on_refund(const std::string& id, std::int64_t amount, Steady::time_point sent,
                        std::optional<std::size_t> node, Result<Response> r) {
  cancel_answers_.count(r, !node);
  time_request(sent, Steady::now(), node, "cancel", r);
  bool ok = false;
  std::string why;
  if (!r.ok()) {
    why = r.error().to_string();
  } else if (r->status != 200) {
    why = "HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 200);
  } else {
    const json j = json::parse(r->body, nullptr, false);
    ok = j.is_object() && j.value("status", std::string()) == "Cancelled" &&
         j.value("refunded", std::int64_t{-1}) == amount;
    if (!ok) why = "unexpected answer " + r->body.substr(0, 200);
  }
  if (ok) {
    t_.refunds.fetch_add(1, std::memory_order_relaxed);
    if (gateway_) {
      std::lock_guard lk(ids_mu_);
      refunded_ids_.push_back(id);
    }
  } else {
    t_.refund_errors.fetch_add(1, std::memory_order_relaxed);
    note_error("refund (cancel): " + why);
  }
  finished();
}

void LoadGen::time_request(Steady::time_point sent, Steady::time_point now, std::optional<std::size_t> node,
                           const char* kind, const Result<Response>& r) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now - sent).count();
  const std::uint64_t micros = us < 0 ? 0 : static_cast<std::uint64_t>(us);
  windows_.record(sent - measure_from_, micros);
  if (micros <= slowest_us_.load(std::memory_order_relaxed)) return;
  std::lock_guard lk(slowest_mu_);
  if (micros <= slowest_.micros) return;
  slowest_ =
      Slowest{micros, node ? nodes_->node(*node).address.api : std::string(), kind, outcome_name(r, !node)};
  slowest_us_.store(micros, std::memory_order_relaxed);
}

void LoadGen::finished() {
  if (o_.rate <= 0) {
    const auto now = Steady::now();
    if (may_send(now)) {
      in_flight_.fetch_sub(1);  // send_payment takes it again
      send_payment(now);
      return;
    }
  }
  if (in_flight_.fetch_sub(1) == 1) {
    std::lock_guard lk(idle_mu_);
    idle_cv_.notify_all();
  }
}

void LoadGen::note_error(std::string e) {
  std::lock_guard lk(err_mu_);
  if (first_error_.empty()) first_error_ = std::move(e);
}

void LoadGen::progress_loop() {
  const bool tty = isatty(STDERR_FILENO) != 0;
  const auto every = tty ? std::chrono::milliseconds(200) : std::chrono::milliseconds(5000);
  std::deque<std::pair<Steady::time_point, std::uint64_t>> window;  // (when, answered) over the last second
  auto next_print = Steady::now() + every;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto now = Steady::now();
    const bool done_sending = (o_.rate > 0 ? stopping_.load() : !may_send(now)) || g_interrupted.load();
    if (done_sending) stopping_.store(true);
    const std::uint64_t answered = all_answers_.load(std::memory_order_relaxed);
    window.emplace_back(now, answered);
    while (window.size() > 1 && now - window.front().first > std::chrono::seconds(1)) window.pop_front();
    if (!o_.quiet && (now >= next_print || done_sending)) {
      next_print = now + every;
      print_progress(now, window, tty);
    }
    if (done_sending) break;
  }
  if (!o_.quiet && tty) std::fprintf(stderr, "\n");
}

void LoadGen::print_progress(Steady::time_point now,
                             const std::deque<std::pair<Steady::time_point, std::uint64_t>>& window,
                             bool tty) const {
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double total = o_.warmup_s + o_.duration_s;
  // With --payments alone the bar shows payments sent of those asked.
  const bool by_count = o_.duration_s <= 0 && o_.payments > 0;
  double rate = 0;
  if (window.size() > 1) {
    const double dt = std::chrono::duration<double>(window.back().first - window.front().first).count();
    if (dt > 0) rate = static_cast<double>(window.back().second - window.front().second) / dt;
  }
  auto v = [](const std::atomic<std::uint64_t>& a) { return static_cast<unsigned long long>(a.load()); };
  const unsigned long long failed = v(t_.declined) + v(t_.gateway_error) + v(t_.failed_other);
  const double p99 = ms(latency_.percentile(99));
  char bar[32] = {};
  const int width = 20;
  const double frac =
      by_count
          ? std::clamp(static_cast<double>(counted_sent_.load()) / static_cast<double>(o_.payments), 0.0, 1.0)
          : std::clamp(total > 0 ? elapsed / total : 0.0, 0.0, 1.0);
  for (int i = 0; i < width; ++i) bar[i] = i < static_cast<int>(frac * width) ? '#' : '-';
  char line[320];
  char when[48];
  if (by_count)
    std::snprintf(when, sizeof when, "%6.1fs %llu/%llu", elapsed, v(counted_sent_),
                  static_cast<unsigned long long>(o_.payments));
  else
    std::snprintf(when, sizeof when, "%6.1f/%gs", elapsed, total);
  // With several nodes: how many take requests now.
  char ready[32] = {};
  if (nodes_->size() > 1) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < nodes_->size(); ++i) n += nodes_->balance().ready(i) ? 1 : 0;
    std::snprintf(ready, sizeof ready, "  ready %zu/%zu", n, nodes_->size());
  }
  std::snprintf(
      line, sizeof line,
      "%s [%s] %7.0f/s  ok %llu  failed %llu  timed out %llu  refused %llu  errors %llu  p99 %.1f ms%s%s",
      when, bar, rate, v(t_.completed), failed, v(t_.timed_out), v(t_.refused), v(t_.errors), p99, ready,
      now < measure_from_ ? "  (warm-up)" : "");
  if (tty)
    std::fprintf(stderr, "\r%s\033[K", line);
  else
    std::fprintf(stderr, "%s\n", line);
}

}  // namespace payment_loadgen
