#pragma once
// Watching of Actor<Msg>: the notifier a watcher leaves with its target, the
// Down notice it sends back, and the watch/unwatch requests. A notice is
// delivered only if the watcher still watches the target when it arrives, so
// nothing is delivered after unwatch(). Included at the end of
// troupe/core/actor.hpp (include that instead); not part of the public API.

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "troupe/core/actor.hpp"

namespace troupe {
namespace detail {

template <class Msg, class F>
class DownNotifierImpl;

template <class Msg, class F>
struct DownEnvelope final : SysEnvelope<DownEnvelope<Msg, F>> {
  DownEnvelope(Down d, F f) : down(std::move(d)), fn(std::move(f)) {}
  void run(CellBase& c) {
    std::unique_ptr<DownEnvelope> self(this);
    auto& w = c.extras().watching;
    auto it = std::find(w.begin(), w.end(), down.actor.cell());
    if (it == w.end()) return;  // unwatched meanwhile: no notice after unwatch
    (*it)->release();
    w.erase(it);
    Msg m = fn(down);
    static_cast<TypedCell<Msg>&>(c).deliver_loose(m);
  }
  void drop(CellBase&) { delete this; }
  Down down;
  F fn;
};

template <class Msg, class F>
class DownNotifierImpl final : public DownNotifier {
 public:
  DownNotifierImpl(CellBase* w, F f) : fn_(std::move(f)) {
    watcher = w;
    w->retain();
  }
  ~DownNotifierImpl() override { watcher->release(); }
  void notify(CellBase& dead, ExitReason reason, const std::string& detail) override {
    auto* e = new DownEnvelope<Msg, F>(Down{AnyRef(CellRef(&dead)), reason, detail}, fn_);
    if (watcher->push_system(e) != Delivery::delivered) delete e;
  }

 private:
  F fn_;
};

// Asks the target to add a watcher; if the target is already gone the notice
// is sent at once.
struct WatchEnvelope final : SysEnvelope<WatchEnvelope> {
  explicit WatchEnvelope(std::unique_ptr<DownNotifier> n) : notifier(std::move(n)) {}
  void run(CellBase& c);   // src/core/cell.cpp
  void drop(CellBase& c);  // target terminated: notify now (src/core/cell.cpp)
  std::unique_ptr<DownNotifier> notifier;
};

struct UnwatchEnvelope final : SysEnvelope<UnwatchEnvelope> {
  explicit UnwatchEnvelope(CellBase* w) : watcher(w) {}
  void run(CellBase& c);
  void drop(CellBase&) { delete this; }
  CellRef watcher;
};

}  // namespace detail

template <class Msg>
template <class M>
void Actor<Msg>::unwatch(const ActorRef<M>& target) {
  auto* tc = target.cell().get();
  auto* x = cell_->extras_if();
  if (!tc || !x) return;
  auto& w = x->watching;
  auto it = std::find(w.begin(), w.end(), tc);
  if (it == w.end()) return;
  (*it)->release();
  w.erase(it);
  auto* e = new detail::UnwatchEnvelope(cell_);
  if (tc->push_system(e) != Delivery::delivered) delete e;
}

template <class Msg>
template <class F>
void Actor<Msg>::watch_cell(detail::CellBase* tc, F to_msg) {
  if (!tc) return;
  auto& w = cell_->extras().watching;
  if (std::find(w.begin(), w.end(), tc) != w.end()) return;  // already watching
  tc->retain();
  w.push_back(tc);
  auto n = std::make_unique<detail::DownNotifierImpl<Msg, F>>(cell_, std::move(to_msg));
  auto* e = new detail::WatchEnvelope(std::move(n));
  if (tc->push_system(e) != Delivery::delivered) e->drop(*tc);
}

}  // namespace troupe
