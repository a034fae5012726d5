// MemoryReminderStore (reminders.hpp): reminders in a map by (owner, name)
// and an index by (next try, owner, name), under one mutex (which makes a
// take and its claim one step).

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "reminder_support.hpp"

namespace troupe {
namespace {

class MemoryReminderStore final : public ReminderStore {
 public:
  std::string_view kind() const noexcept override { return "memory"; }

  Result<void> set(const ReminderSpec& spec) override {
    if (auto r = reminders::check(spec); !r) return r;
    std::lock_guard lk(mu_);
    erase_locked(spec.owner, spec.name);
    Reminder r = reminders::fresh(spec);
    due_.emplace(r.next_try_ms, r.owner, r.name);
    by_key_.emplace(Key{r.owner, r.name}, std::move(r));
    return {};
  }

  Result<bool> cancel(std::string_view owner, std::string_view name) override {
    if (auto r = reminders::check_key(owner, name); !r) return std::move(r).error();
    std::lock_guard lk(mu_);
    return erase_locked(owner, name);
  }

  Result<std::vector<Reminder>> list(std::string_view owner) override {
    std::lock_guard lk(mu_);
    std::vector<Reminder> out;
    for (auto it = by_key_.lower_bound(Key{std::string(owner), std::string()}); it != by_key_.end(); ++it) {
      if (it->first.first != owner) break;
      out.push_back(it->second);
    }
    return out;
  }

  Result<std::vector<Reminder>> take_due(std::int64_t now_ms, std::size_t limit, std::int64_t lease_ms) override {
    if (auto r = reminders::check_take(limit, lease_ms); !r) return std::move(r).error();
    std::lock_guard lk(mu_);
    std::vector<Reminder> out;
    for (const auto& [t, owner, name] : due_) {
      if (t > now_ms || out.size() >= limit) break;
      out.push_back(by_key_.at(Key{owner, name}));
    }
    // The claim: each moves to the lease's end, under the same lock.
    const std::int64_t until = reminders::claim_end(now_ms, lease_ms);
    for (const Reminder& r : out) {
      Reminder& s = by_key_.at(Key{r.owner, r.name});
      due_.erase(Index{s.next_try_ms, s.owner, s.name});
      s.next_try_ms = until;
      due_.emplace(s.next_try_ms, s.owner, s.name);
    }
    return out;
  }

  Result<bool> record_fired(const Reminder& r, std::int64_t fired_ms) override {
    std::lock_guard lk(mu_);
    Reminder* s = find_locked(r);
    if (s == nullptr) return false;
    if (s->period_ms == 0) return erase_locked(r.owner, r.name);
    due_.erase(Index{s->next_try_ms, s->owner, s->name});
    s->due_ms = reminders::next_due(s->due_ms, s->period_ms, fired_ms);
    s->next_try_ms = s->due_ms;
    s->attempts = 0;
    s->last_error.clear();
    due_.emplace(s->next_try_ms, s->owner, s->name);
    return true;
  }

  Result<bool> record_failed(const Reminder& r, std::int64_t retry_ms, std::string_view error) override {
    std::lock_guard lk(mu_);
    Reminder* s = find_locked(r);
    if (s == nullptr) return false;
    due_.erase(Index{s->next_try_ms, s->owner, s->name});
    ++s->attempts;
    s->next_try_ms = retry_ms;
    s->last_error = std::string(error);
    due_.emplace(s->next_try_ms, s->owner, s->name);
    return true;
  }

  Result<ReminderSummary> summary(std::int64_t now_ms) override {
    std::lock_guard lk(mu_);
    ReminderSummary s;
    if (!due_.empty()) s.next_try_ms = std::get<0>(*due_.begin());
    for (const auto& i : due_) {
      if (std::get<0>(i) > now_ms) break;
      ++s.due;
    }
    return s;
  }

 private:
  using Key = std::pair<std::string, std::string>;
  using Index = std::tuple<std::int64_t, std::string, std::string>;

  Reminder* find_locked(const Reminder& r) {
    auto it = by_key_.find(Key{r.owner, r.name});
    if (it == by_key_.end() || it->second.token != r.token || it->second.due_ms != r.due_ms) return nullptr;
    return &it->second;
  }

  bool erase_locked(std::string_view owner, std::string_view name) {
    auto it = by_key_.find(Key{std::string(owner), std::string(name)});
    if (it == by_key_.end()) return false;
    due_.erase(Index{it->second.next_try_ms, it->second.owner, it->second.name});
    by_key_.erase(it);
    return true;
  }

  std::mutex mu_;
  std::map<Key, Reminder, std::less<>> by_key_;
  std::set<Index> due_;
};

}  // namespace

std::shared_ptr<ReminderStore> make_memory_reminder_store() { return std::make_shared<MemoryReminderStore>(); }

}  // namespace troupe
