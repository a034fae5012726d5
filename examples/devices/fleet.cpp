// The device fleet's bookkeeping (fleet.hpp).

#include "fleet.hpp"

#include <algorithm>
#include <cstdio>

namespace devices {

using json = nlohmann::json;

namespace {

std::int64_t ms(Steady::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

}  // namespace

Fleet::Fleet(std::size_t initial, std::chrono::milliseconds reading_interval, Steady::time_point now)
    : interval_(reading_interval) {
  add(initial, now);
}

std::string Fleet::name(std::uint64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "dev-%05llu", static_cast<unsigned long long>(n));
  return buf;
}

std::string Fleet::desired_set() const {
  std::lock_guard lk(mu_);
  std::string out = "# the simulated device fleet: <device> <spec>\n";
  out.reserve(out.size() + in_fleet_ * 48);
  for (const auto& [id, d] : devices_) {
    if (!d.in_fleet) continue;
    // The model varies with the id so that specs differ between devices.
    const char model = static_cast<char>('1' + (id.back() - '0') % 3);
    out += id + " {\"model\":\"m" + model + "\",\"interval_ms\":" + std::to_string(interval_.count()) + "}\n";
  }
  return out;
}

std::vector<std::string> Fleet::add(std::size_t n, Steady::time_point now) {
  std::lock_guard lk(mu_);
  std::vector<std::string> ids;
  ids.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::string id = name(next_++);
    Device& d = devices_[id];
    d.in_fleet = true;
    d.workerless_since = now;
    ++in_fleet_;
    ids.push_back(std::move(id));
  }
  return ids;
}

std::vector<std::string> Fleet::remove(std::size_t n, Steady::time_point) {
  std::lock_guard lk(mu_);
  std::vector<std::string> ids;
  for (auto it = devices_.begin(); it != devices_.end() && ids.size() < n;) {
    if (!it->second.in_fleet) {
      ++it;
      continue;
    }
    ids.push_back(it->first);
    --in_fleet_;
    if (it->second.workers.empty()) {
      it = devices_.erase(it);
    } else {
      it->second.in_fleet = false;  // kept until its workers detach
      it->second.workerless_since.reset();
      ++it;
    }
  }
  return ids;
}

bool Fleet::contains(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto it = devices_.find(id);
  return it != devices_.end() && it->second.in_fleet;
}

void Fleet::close_stretch(Device& d, Steady::time_point now) {
  if (!d.workerless_since) return;
  const auto took = now - *d.workerless_since;
  if (d.had_worker) {
    longest_gap_ = std::max(longest_gap_, took);
    ++gaps_;
  } else {
    longest_wait_ = std::max(longest_wait_, took);
  }
  d.workerless_since.reset();
}

bool Fleet::attach(const std::string& id, const std::string& worker, Steady::time_point now) {
  std::lock_guard lk(mu_);
  auto it = devices_.find(id);
  if (it == devices_.end() || !it->second.in_fleet) {
    ++refused_;
    return false;
  }
  Device& d = it->second;
  ++attaches_;
  ++connections_;
  if (!d.workers.empty()) {
    ++doubles_;
    if (double_samples_.size() < 10) {
      json ws = json::array();
      for (const auto& w : d.workers) ws.push_back(w);
      ws.push_back(worker);
      double_samples_.push_back({{"device", id}, {"workers", ws}});
    }
  }
  close_stretch(d, now);
  d.had_worker = true;
  d.workers.insert(worker);
  return true;
}

void Fleet::detach(const std::string& id, const std::string& worker, Steady::time_point now) {
  std::lock_guard lk(mu_);
  auto it = devices_.find(id);
  if (it == devices_.end()) return;
  Device& d = it->second;
  auto w = d.workers.find(worker);
  if (w == d.workers.end()) return;
  d.workers.erase(w);
  --connections_;
  if (!d.workers.empty()) return;
  if (d.in_fleet)
    d.workerless_since = now;
  else
    devices_.erase(it);
}

void Fleet::mark(Steady::time_point now) {
  std::lock_guard lk(mu_);
  longest_gap_ = longest_wait_ = Steady::duration::zero();
  gaps_ = 0;
  for (auto& [id, d] : devices_)
    if (d.workerless_since) d.workerless_since = now;
}

std::uint64_t Fleet::doubles() const {
  std::lock_guard lk(mu_);
  return doubles_;
}

json Fleet::stats(Steady::time_point now) const {
  std::lock_guard lk(mu_);
  std::size_t running = 0, workerless = 0;
  Steady::duration gap = longest_gap_, wait = longest_wait_;
  for (const auto& [id, d] : devices_) {
    if (!d.in_fleet) continue;
    if (d.workers.empty()) {
      ++workerless;
      if (d.workerless_since) (d.had_worker ? gap : wait) = std::max(d.had_worker ? gap : wait, now - *d.workerless_since);
    } else {
      ++running;
    }
  }
  return {{"devices", in_fleet_},
          {"running", running},
          {"workerless", workerless},
          {"connections", connections_},
          {"attaches", attaches_},
          {"refused", refused_},
          {"doubles", doubles_},
          {"double_samples", double_samples_},
          {"gaps", gaps_},
          {"longest_gap_ms", ms(gap)},
          {"longest_wait_ms", ms(wait)}};
}

}  // namespace devices
