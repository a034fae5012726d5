#pragma once
// detail::AppendListeners: the callbacks a journal calls after events were
// stored (event_query.hpp "Live"). Internal to the persist layer.
//
// Thread-safe. notify() calls every listener under the set's mutex, so
// remove() returns only once the listener is not running; a listener must
// therefore not add or remove listeners itself.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

namespace troupe::detail {

class AppendListeners {
 public:
  std::uint64_t add(std::function<void()> f);
  void remove(std::uint64_t id);
  // Calls every listener (nothing when there are none).
  void notify();

 private:
  std::mutex mu_;
  std::map<std::uint64_t, std::function<void()>> listeners_;  // guarded by mu_
  std::uint64_t next_id_ = 0;                                 // guarded by mu_
  std::atomic<std::size_t> size_{0};
};

}  // namespace troupe::detail
