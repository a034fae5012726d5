// payment_loadgen's balancing: the round robin over ready nodes, the
// windowed latencies and the node pool with its /ready poller. See
// loadgen_balance.hpp.

#include "loadgen_balance.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "troupe/net/url.hpp"

namespace payment_loadgen {

// --- ReadyRoundRobin ----------------------------------------------------------------

ReadyRoundRobin::ReadyRoundRobin(std::vector<bool> ready)
    : ready_(std::move(ready)), turned_not_ready_(ready_.size(), 0) {}

std::optional<std::size_t> ReadyRoundRobin::pick_locked() {
  const std::size_t n = ready_.size();
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (next_ + k) % n;
    if (ready_[i]) {
      next_ = (i + 1) % n;
      return i;
    }
  }
  return std::nullopt;
}

void ReadyRoundRobin::route(Steady::time_point now, Steady::time_point deadline, Go go) {
  std::optional<std::size_t> node;
  {
    std::lock_guard lk(mu_);
    // Behind earlier parked requests a new one waits its turn.
    if (parked_.empty()) node = pick_locked();
    if (!node) {
      ++waits_;
      parked_.push_back(Parked{now, deadline, std::move(go)});
      return;
    }
  }
  go(node);
}

void ReadyRoundRobin::set_ready(std::size_t node, bool ready, Steady::time_point now) {
  std::vector<std::pair<Go, std::size_t>> to_send;
  {
    std::lock_guard lk(mu_);
    if (node >= ready_.size() || ready_[node] == ready) return;
    ready_[node] = ready;
    if (!ready) {
      ++turned_not_ready_[node];
      return;
    }
    while (!parked_.empty()) {
      const auto to = pick_locked();  // a node just turned ready: never empty
      longest_wait_ = std::max(longest_wait_, now - parked_.front().since);
      to_send.emplace_back(std::move(parked_.front().go), *to);
      parked_.pop_front();
    }
  }
  for (auto& [go, to] : to_send) go(to);
}

void ReadyRoundRobin::expire(Steady::time_point now) {
  std::vector<Go> expired;
  {
    std::lock_guard lk(mu_);
    // Deadlines are not in order (requests bring their own), so look at all.
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (it->deadline <= now) {
        longest_wait_ = std::max(longest_wait_, now - it->since);
        expired.push_back(std::move(it->go));
        it = parked_.erase(it);
        ++gave_up_;
      } else {
        ++it;
      }
    }
  }
  for (auto& go : expired) go(std::nullopt);
}

void ReadyRoundRobin::close() {
  std::deque<Parked> all;
  {
    std::lock_guard lk(mu_);
    all.swap(parked_);
    gave_up_ += all.size();
  }
  for (auto& p : all) p.go(std::nullopt);
}

bool ReadyRoundRobin::ready(std::size_t node) const {
  std::lock_guard lk(mu_);
  return node < ready_.size() && ready_[node];
}

std::optional<Steady::time_point> ReadyRoundRobin::next_deadline() const {
  std::lock_guard lk(mu_);
  std::optional<Steady::time_point> first;
  for (const auto& p : parked_)
    if (!first || p.deadline < *first) first = p.deadline;
  return first;
}

std::uint64_t ReadyRoundRobin::waits() const {
  std::lock_guard lk(mu_);
  return waits_;
}

std::uint64_t ReadyRoundRobin::gave_up() const {
  std::lock_guard lk(mu_);
  return gave_up_;
}

Steady::duration ReadyRoundRobin::longest_wait() const {
  std::lock_guard lk(mu_);
  return longest_wait_;
}

std::uint64_t ReadyRoundRobin::turned_not_ready(std::size_t node) const {
  std::lock_guard lk(mu_);
  return node < turned_not_ready_.size() ? turned_not_ready_[node] : 0;
}

// --- WindowLatency ------------------------------------------------------------------

void WindowLatency::record(Steady::duration since_start, std::uint64_t micros) {
  const auto at = std::max(since_start, Steady::duration::zero());
  const auto index = static_cast<std::size_t>(at / window_);
  const auto value = static_cast<std::uint32_t>(std::min<std::uint64_t>(micros, UINT32_MAX));
  std::lock_guard lk(mu_);
  if (by_window_.size() <= index) by_window_.resize(index + 1);
  by_window_[index].push_back(value);
}

std::uint64_t WindowLatency::percentile(std::vector<std::uint32_t>& values, double percent) {
  if (values.empty()) return 0;
  // Nearest rank: the smallest value with at least `percent`% at or below it.
  const double rank = std::ceil(percent / 100.0 * static_cast<double>(values.size()));
  const std::size_t k = std::clamp<std::size_t>(static_cast<std::size_t>(rank), 1, values.size()) - 1;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
  return values[k];
}

std::vector<WindowLatency::Window> WindowLatency::windows(std::size_t count) const {
  std::vector<std::vector<std::uint32_t>> copy;
  {
    std::lock_guard lk(mu_);
    copy = by_window_;
  }
  if (count == 0) count = copy.size();
  if (count > 0 && copy.size() > count) {
    for (std::size_t i = count; i < copy.size(); ++i)
      copy[count - 1].insert(copy[count - 1].end(), copy[i].begin(), copy[i].end());
    copy.resize(count);
  }
  std::vector<Window> out(count);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].index = i;
    if (i >= copy.size() || copy[i].empty()) continue;
    auto& v = copy[i];
    out[i].count = v.size();
    out[i].max_us = *std::max_element(v.begin(), v.end());
    out[i].p99_us = percentile(v, 99);
  }
  return out;
}

std::uint64_t WindowLatency::p99_all() const {
  std::vector<std::uint32_t> all;
  {
    std::lock_guard lk(mu_);
    for (const auto& w : by_window_) all.insert(all.end(), w.begin(), w.end());
  }
  return percentile(all, 99);
}

// --- NodePool -----------------------------------------------------------------------

namespace {

std::vector<bool> always_ready(const std::vector<std::unique_ptr<NodePool::Node>>& nodes) {
  std::vector<bool> ready;
  for (const auto& n : nodes) ready.push_back(n->address.admin.empty());
  return ready;
}

}  // namespace

NodePool::NodePool(std::vector<std::unique_ptr<Node>> nodes)
    : nodes_(std::move(nodes)), rr_(always_ready(nodes_)) {}

NodePool::~NodePool() { close(); }

void NodePool::close() {
  stop();
  for (auto& n : nodes_) {
    if (n->admin) n->admin->close();
    n->api->close();
  }
}

troupe::Result<std::unique_ptr<NodePool>> NodePool::create(const std::vector<NodeAddress>& addresses,
                                                           troupe::http::ClientSettings api) {
  std::vector<std::unique_ptr<Node>> nodes;
  for (const auto& a : addresses) {
    auto n = std::make_unique<Node>();
    n->address = a;
    auto url = troupe::http::parse_url(a.api);
    if (!url.ok())
      return troupe::Error(troupe::ErrorCode::invalid_argument, a.api + ": " + url.error().message());
    auto s = api;
    s.host = url->host;
    s.port = url->port;
    auto c = troupe::http::Client::create(s);
    if (!c.ok()) return troupe::Error(c.error().code(), a.api + ": " + c.error().message());
    n->api = std::move(c).value();
    if (!a.admin.empty()) {
      auto admin = troupe::http::parse_url(a.admin);
      if (!admin.ok())
        return troupe::Error(troupe::ErrorCode::invalid_argument, a.admin + ": " + admin.error().message());
      troupe::http::ClientSettings p;
      p.host = admin->host;
      p.port = admin->port;
      p.max_connections = 1;
      p.max_queued = 4;
      p.connect_timeout = poll_timeout;
      p.request_timeout = poll_timeout;
      auto ac = troupe::http::Client::create(p);
      if (!ac.ok()) return troupe::Error(ac.error().code(), a.admin + ": " + ac.error().message());
      n->admin = std::move(ac).value();
    }
    nodes.push_back(std::move(n));
  }
  return std::unique_ptr<NodePool>(new NodePool(std::move(nodes)));
}

void NodePool::poll(std::size_t i) {
  Node& n = *nodes_[i];
  if (!n.admin || n.poll_in_flight.exchange(true)) return;
  n.admin->request("GET", "/ready", "", "", [this, i](troupe::Result<troupe::http::Response> r) {
    // A poll cut short by close() says nothing about the node.
    if (r.ok() || r.error().code() != troupe::ErrorCode::shutting_down)
      rr_.set_ready(i, r.ok() && r->status == 200, Steady::now());
    nodes_[i]->poll_in_flight.store(false);
    std::lock_guard lk(mu_);
    cv_.notify_all();
  });
}

void NodePool::start_polling() {
  for (std::size_t i = 0; i < nodes_.size(); ++i) poll(i);
  {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, poll_timeout + std::chrono::milliseconds(100), [&] {
      return std::none_of(nodes_.begin(), nodes_.end(),
                          [](const auto& n) { return n->poll_in_flight.load(); });
    });
  }
  const bool any_admin =
      std::any_of(nodes_.begin(), nodes_.end(), [](const auto& n) { return n->admin != nullptr; });
  if (any_admin) poller_ = std::thread([this] { poller_loop(); });
}

void NodePool::poller_loop() {
  auto next_poll = Steady::now() + poll_every;
  std::unique_lock lk(mu_);
  while (!stopping_) {
    auto until = next_poll;
    if (const auto d = rr_.next_deadline(); d && *d < until) until = *d;
    cv_.wait_until(lk, until, [&] { return stopping_; });
    if (stopping_) break;
    lk.unlock();
    const auto now = Steady::now();
    rr_.expire(now);
    if (now >= next_poll) {
      for (std::size_t i = 0; i < nodes_.size(); ++i) poll(i);
      next_poll = std::max(next_poll + poll_every, now);
    }
    lk.lock();
  }
}

void NodePool::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (poller_.joinable()) poller_.join();
  rr_.close();
}

void NodePool::route(Steady::time_point deadline, ReadyRoundRobin::Go go) {
  rr_.route(Steady::now(), deadline, std::move(go));
}

}  // namespace payment_loadgen
