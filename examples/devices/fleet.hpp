#pragma once
// The simulated device fleet's bookkeeping: which devices exist, which
// workers are attached to each, and the two things the devices demo must
// show — that no device ever had two workers at once, and how long a
// device went without one. The device server (device_server_main.cpp)
// drives it from its TCP connections and its HTTP control routes.
//
// Devices are named "dev-00001", "dev-00002", ... in the order they are
// added; removing takes the lowest ids still in the fleet. A device's
// desired-set line (placement_source.hpp's text format) carries a small
// JSON spec:
//
//   dev-00001 {"model":"m1","interval_ms":500}
//
// Times: a *gap* is a stretch without a worker after the device had one
// (a failover, a move); a *wait* is the time from the device joining the
// fleet to its first worker (a sync round). Both are kept as the longest
// seen since the last mark() and include stretches still open.
//
// Thread safety: every member is thread-safe (one mutex). Value-owning.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace devices {

using Steady = std::chrono::steady_clock;

class Fleet {
 public:
  Fleet(std::size_t initial, std::chrono::milliseconds reading_interval, Steady::time_point now);

  // The fleet as a desired set: one "<id> <spec>" line per device.
  std::string desired_set() const;
  // Adds `n` devices with the next ids; returns them.
  std::vector<std::string> add(std::size_t n, Steady::time_point now);
  // Removes the `n` lowest ids in the fleet (fewer if it is smaller);
  // returns them. Their workers stay attached until they detach.
  std::vector<std::string> remove(std::size_t n, Steady::time_point now);
  bool contains(const std::string& id) const;

  // A worker (named by its node and epoch, for the record) attaches to
  // device `id`: false, and nothing counted, if the device is not in the
  // fleet. A second worker on one device is counted as a double.
  bool attach(const std::string& id, const std::string& worker, Steady::time_point now);
  void detach(const std::string& id, const std::string& worker, Steady::time_point now);

  // Starts the gap and wait records afresh (stretches open now count from
  // now).
  void mark(Steady::time_point now);
  // devices, running (with a worker), workerless, connections, attaches,
  // refused (attaches to devices not in the fleet), doubles (moments a
  // device got a second worker), double_samples (the first few: device and
  // workers), longest_gap_ms, longest_wait_ms, gaps (closed gaps since the
  // mark).
  nlohmann::json stats(Steady::time_point now) const;
  std::uint64_t doubles() const;

 private:
  struct Device {
    bool in_fleet = true;
    bool had_worker = false;
    std::optional<Steady::time_point> workerless_since;
    std::multiset<std::string> workers;
  };
  static std::string name(std::uint64_t n);
  void close_stretch(Device& d, Steady::time_point now);

  mutable std::mutex mu_;
  std::chrono::milliseconds interval_;
  std::uint64_t next_ = 1;
  std::map<std::string, Device> devices_;  // in the fleet, or still attached after removal
  std::size_t in_fleet_ = 0;
  std::uint64_t attaches_ = 0, refused_ = 0, doubles_ = 0, gaps_ = 0;
  std::uint64_t connections_ = 0;
  Steady::duration longest_gap_{}, longest_wait_{};
  std::vector<nlohmann::json> double_samples_;
};

}  // namespace devices
