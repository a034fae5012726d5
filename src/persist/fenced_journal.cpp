#include "troupe/persist/fenced_journal.hpp"

#include <deque>
#include <functional>
#include <mutex>
#include <utility>

namespace troupe {

// Shared by the view and the raise's callback, which may outlive the view.
class FencedJournal::State {
 public:
  State(std::shared_ptr<Journal> in, Fence f) : inner(std::move(in)), fence(std::move(f)) {}

  // Runs `op(nullptr)` now if the fence is stored, `op(&error)` if it was
  // refused, or queues `op` until the raise is known. Queued operations run
  // in the order they came, before any later one.
  void run(std::function<void(const Error*)> op) {
    std::unique_lock lk(mu);
    if (!outcome) {
      waiting.push_back(std::move(op));
      return;
    }
    if (outcome->ok()) {
      lk.unlock();
      return op(nullptr);
    }
    Error e = outcome->error();
    lk.unlock();
    op(&e);
  }

  // The raise is known: drains what waited, in order, then lets later
  // operations through. Operations made while draining queue behind.
  void settle(Result<void> r) {
    std::unique_lock lk(mu);
    for (;;) {
      std::deque<std::function<void(const Error*)>> batch;
      batch.swap(waiting);
      if (batch.empty()) {
        outcome = std::move(r);
        return;
      }
      lk.unlock();
      for (auto& op : batch) {
        if (r.ok()) {
          op(nullptr);
        } else {
          Error e = r.error();
          op(&e);
        }
      }
      lk.lock();
    }
  }

  const std::shared_ptr<Journal> inner;
  const Fence fence;
  mutable std::mutex mu;
  std::optional<Result<void>> outcome;  // guarded by mu
  std::deque<std::function<void(const Error*)>> waiting;  // guarded by mu
};

std::shared_ptr<FencedJournal> FencedJournal::open(std::shared_ptr<Journal> inner, Fence fence) {
  auto state = std::make_shared<State>(std::move(inner), std::move(fence));
  std::shared_ptr<FencedJournal> view(new FencedJournal(state));
  if (auto v = validate_fence(state->fence.key, state->fence.value); !v) {
    state->settle(std::move(v));
    return view;
  }
  state->inner->raise_fence(state->fence.key, state->fence.value,
                            [state](Result<void> r) { state->settle(std::move(r)); });
  return view;
}

FencedJournal::FencedJournal(std::shared_ptr<State> state) : state_(std::move(state)) {}

FencedJournal::~FencedJournal() {
  // Operations still waiting for the raise are answered when it completes:
  // the state lives on in the raise's callback.
}

namespace {
// Wraps `done` so that a refused raise answers it with the raise's error.
template <class T, class Forward>
std::function<void(const Error*)> gated(Journal::Callback<T> done, Forward forward) {
  return [done = std::move(done), forward = std::move(forward)](const Error* refused) mutable {
    if (refused != nullptr) return done(*refused);
    forward(std::move(done));
  };
}
}  // namespace

void FencedJournal::append(AppendBatch batch, Callback<void> done) {
  auto* st = state_.get();
  batch.fence = st->fence;
  st->run(gated<void>(std::move(done), [st, b = std::move(batch)](Callback<void> d) mutable {
    st->inner->append(std::move(b), std::move(d));
  }));
}

void FencedJournal::replay(std::string id, std::uint64_t from, std::uint64_t to,
                           Callback<std::vector<EventRecord>> done) {
  auto* st = state_.get();
  st->run(gated<std::vector<EventRecord>>(std::move(done), [st, id = std::move(id), from, to](auto d) mutable {
    st->inner->replay(std::move(id), from, to, std::move(d));
  }));
}

void FencedJournal::highest_seq(std::string id, Callback<std::uint64_t> done) {
  auto* st = state_.get();
  st->run(gated<std::uint64_t>(std::move(done), [st, id = std::move(id)](auto d) mutable {
    st->inner->highest_seq(std::move(id), std::move(d));
  }));
}

void FencedJournal::delete_up_to(std::string id, std::uint64_t to, Callback<void> done) {
  auto* st = state_.get();
  st->run(gated<void>(std::move(done), [st, id = std::move(id), to](auto d) mutable {
    st->inner->delete_up_to(std::move(id), to, std::move(d));
  }));
}

void FencedJournal::save_snapshot(std::string id, SnapshotRecord snapshot, Callback<void> done) {
  auto* st = state_.get();
  st->run(gated<void>(std::move(done), [st, id = std::move(id), s = std::move(snapshot)](auto d) mutable {
    st->inner->save_snapshot(std::move(id), std::move(s), std::move(d));
  }));
}

void FencedJournal::load_snapshot(std::string id, Callback<std::optional<SnapshotRecord>> done) {
  auto* st = state_.get();
  st->run(gated<std::optional<SnapshotRecord>>(std::move(done), [st, id = std::move(id)](auto d) mutable {
    st->inner->load_snapshot(std::move(id), std::move(d));
  }));
}

void FencedJournal::recover(std::string id, Callback<Recovery> done) {
  auto* st = state_.get();
  st->run(gated<Recovery>(std::move(done), [st, id = std::move(id)](auto d) mutable {
    st->inner->recover(std::move(id), std::move(d));
  }));
}

void FencedJournal::raise_fence(std::string key, std::uint64_t value, Callback<void> done) {
  auto* st = state_.get();
  st->run(gated<void>(std::move(done), [st, key = std::move(key), value](auto d) mutable {
    st->inner->raise_fence(std::move(key), value, std::move(d));
  }));
}

void FencedJournal::highest_fence(Callback<std::uint64_t> done) {
  // Not gated: it reads what every owner raised, this one's fence included
  // or not.
  state_->inner->highest_fence(std::move(done));
}

std::string_view FencedJournal::name() const noexcept { return state_->inner->name(); }

JournalStats FencedJournal::journal_stats() const { return state_->inner->journal_stats(); }

bool FencedJournal::stores_outbox() const noexcept { return state_->inner->stores_outbox(); }

void FencedJournal::claim_outbox(OutboxClaim claim, Callback<std::vector<OutboxEntry>> done) {
  state_->inner->claim_outbox(std::move(claim), std::move(done));
}

void FencedJournal::settle_outbox(OutboxSettlement settlement, Callback<void> done) {
  state_->inner->settle_outbox(std::move(settlement), std::move(done));
}

void FencedJournal::read_outbox(OutboxQuery query, Callback<OutboxView> done) {
  state_->inner->read_outbox(query, std::move(done));
}

bool FencedJournal::supports_queries() const noexcept { return state_->inner->supports_queries(); }

void FencedJournal::query_events(EventQuery query, Callback<EventPage> done) {
  state_->inner->query_events(std::move(query), std::move(done));
}

std::uint64_t FencedJournal::add_append_listener(std::function<void()> listener) {
  return state_->inner->add_append_listener(std::move(listener));
}

void FencedJournal::remove_append_listener(std::uint64_t id) { state_->inner->remove_append_listener(id); }

const Fence& FencedJournal::fence() const noexcept { return state_->fence; }

std::optional<Result<void>> FencedJournal::raised() const {
  std::lock_guard lk(state_->mu);
  return state_->outcome;
}

}  // namespace troupe
