#pragma once
// What a TestProbe (troupe/testkit/probe.hpp) is made of: the queue between
// the probe's actor and the test's thread, the actor that fills it, the
// helper that watches an actor on the probe's behalf, and the type names a
// failed expectation prints. Not part of the public API.

#include <cxxabi.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <variant>

#include "troupe/core/actor.hpp"

namespace troupe::testkit::detail {

inline std::string demangle(const char* mangled) {
  int status = 0;
  char* s = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string out = (status == 0 && s) ? s : mangled;
  std::free(s);
  return out;
}

template <class T>
inline constexpr bool is_variant_v = false;
template <class... Ts>
inline constexpr bool is_variant_v<std::variant<Ts...>> = true;

// The human name of what `m` holds: the alternative for a variant, else the type.
template <class Msg>
std::string held_type_name(const Msg& m) {
  if constexpr (is_variant_v<Msg>) {
    return std::visit([](const auto& alt) { return demangle(typeid(alt).name()); }, m);
  } else {
    return demangle(typeid(Msg).name());
  }
}

inline long long to_ms(Duration d) {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

// The queue between the probe actor (producer, a worker thread) and the test.
template <class Msg>
class ProbeInbox {
 public:
  void push(Msg&& m) {
    {
      std::lock_guard lk(mu_);
      q_.push_back(std::move(m));
    }
    cv_.notify_all();
  }
  std::optional<Msg> pop_for(Duration timeout) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return !q_.empty(); })) return std::nullopt;
    std::optional<Msg> m(std::move(q_.front()));
    q_.pop_front();
    return m;
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return q_.size();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Msg> q_;
};

template <class Msg>
struct ProbeActor : Actor<Msg> {
  explicit ProbeActor(std::shared_ptr<ProbeInbox<Msg>> in) : inbox(std::move(in)) {}
  void receive(Msg& m) { inbox->push(std::move(m)); }
  std::shared_ptr<ProbeInbox<Msg>> inbox;
};

// Watches one actor on behalf of a probe and forwards its Down notice.
template <class Msg, class M>
struct ProbeWatcher : Actor<Down> {
  ProbeWatcher(ActorRef<M> t, ActorRef<Msg> p) : target(std::move(t)), probe(std::move(p)) {}
  void on_start() { watch(target); }
  void receive(Down& d) {
    probe.tell(Msg(std::move(d)));
    stop();
  }
  ActorRef<M> target;
  ActorRef<Msg> probe;
};

}  // namespace troupe::testkit::detail
