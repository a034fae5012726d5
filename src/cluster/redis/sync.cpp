// sync(): a group's desired set, read by a DesiredSource on the
// SourceRunner's thread, is compared with Redis and applied as assigns,
// spec updates and unassigns, again every sync_interval unless the caller
// times the rounds itself.

#include "coordinator_impl.hpp"

namespace troupe::cluster {

namespace detail {

void SourceRunner::post(std::function<void()> job) {
  std::lock_guard lk(mu_);
  if (stopping_) return;
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  jobs_.push_back(std::move(job));
  cv_.notify_one();
}

void SourceRunner::shutdown() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    jobs_.clear();
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void SourceRunner::run() {
  std::unique_lock lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lk.unlock();
    job();
    lk.lock();
  }
}

}  // namespace detail

// --- sync ------------------------------------------------------------------------------

Future<SyncReport> Coordinator::Impl::sync(const std::string& group, DesiredSource source, bool periodic) {
  return call<SyncReport>([this, group, source = std::move(source), periodic](Promise<SyncReport>& p) mutable {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (!source)
      return p.set_error(Error(ErrorCode::invalid_argument, "sync of '" + group + "' without a source"));
    if (phase_ == Phase::stopping || phase_ == Phase::stopped) return p.set_error(shutting_down_error());
    SyncState& st = syncs_[group];
    st.source = std::move(source);
    st.periodic = periodic;
    st.waiters.push_back(std::move(p));
    if (!st.timer) st.timer = std::make_unique<asio::steady_timer>(io_);
    if (!periodic) st.timer->cancel();
    if (phase_ == Phase::running) run_sync(group);
  });
}

void Coordinator::Impl::run_sync(const std::string& group) {
  SyncState& st = syncs_.at(group);
  if (st.in_flight) {
    st.again = true;
    return;
  }
  st.in_flight = true;
  st.again = false;
  for (auto& w : st.waiters) st.round_waiters.push_back(std::move(w));
  st.waiters.clear();
  std::weak_ptr<Impl> weak = weak_from_this();
  sources_.post([weak, group, source = st.source] {
    Result<DesiredSet> r = Error(ErrorCode::invalid_argument, "no source");
    try {
      r = source();
    } catch (const std::exception& ex) {
      r = Error(ErrorCode::invalid_argument, std::string("the desired-set source threw: ") + ex.what());
    } catch (...) {
      r = Error(ErrorCode::invalid_argument, "the desired-set source threw");
    }
    auto self = weak.lock();
    if (!self) return;
    Impl* raw = self.get();
    asio::post(raw->io_, [raw, group, r = std::move(r)]() mutable {
      if (!raw->halted_) raw->on_desired(group, std::move(r));
    });
  });
}

void Coordinator::Impl::on_desired(const std::string& group, Result<DesiredSet> desired) {
  if (!desired.ok()) {
    log(CoordinatorLogLevel::warning,
        "sync of '" + group + "' changed nothing: " + desired.error().message());
    return finish_sync(group, std::move(desired).error());
  }
  if (phase_ != Phase::running) return finish_sync(group, shutting_down_error());
  if (!link_up_) return finish_sync(group, not_connected_error());
  auto want = std::make_shared<DesiredSet>(std::move(*desired));
  eval(Script::snapshot, {group}, [this, group, want](Reply r) {
    if (halted_) return;
    if (!r.ok()) return finish_sync(group, std::move(r).error());
    const RedisReply& rep = *r;
    if (rep.elements[0].str != "OK" || rep.elements.size() != 2 || !rep.elements[1].is_array() ||
        rep.elements[1].elements.size() % 2 != 0)
      return finish_sync(group, unexpected(Script::snapshot, rep));
    std::map<std::string, std::string> have;
    for (std::size_t i = 0; i + 1 < rep.elements[1].elements.size(); i += 2)
      have.emplace(rep.elements[1].elements[i].str, rep.elements[1].elements[i + 1].str);

    struct Round {
      SyncReport report;
      std::size_t left = 0;
      bool issued = false;
    };
    auto round = std::make_shared<Round>();
    round->report.desired = want->size();
    auto one_done = [this, group, round] {
      if (--round->left != 0 || !round->issued) return;
      cmd_.command({"PUBLISH", keys_.events(), "sync " + group}, [](Reply) {});
      if (!round->report.failed.empty())
        log(CoordinatorLogLevel::warning,
            "sync of '" + group + "': " + std::to_string(round->report.failed.size()) +
                " units failed, first: " + round->report.failed.front().second.message());
      finish_sync(group, round->report);
    };
    round->left = 1;  // held until every command is issued
    for (const auto& [unit, spec] : *want) {
      if (auto v = validate_unit(unit); !v.ok()) {
        round->report.failed.emplace_back(unit, v.error());
        continue;
      }
      auto h = have.find(unit);
      if (h == have.end()) {
        ++round->left;
        do_assign(group, unit, spec, false, [round, unit = unit, one_done](Result<Placement> pr) {
          if (!pr.ok()) {
            round->report.failed.emplace_back(unit, pr.error());
          } else if (pr->outcome == PlacementOutcome::assigned) {
            ++round->report.assigned;
          } else {
            ++round->report.unchanged;
          }
          one_done();
        });
      } else if (h->second != spec) {
        ++round->left;
        do_set_spec(group, unit, spec, false, [round, unit = unit, one_done](Result<bool> ur) {
          if (!ur.ok()) {
            round->report.failed.emplace_back(unit, ur.error());
          } else if (*ur) {
            ++round->report.updated;
          } else {
            ++round->report.unchanged;
          }
          one_done();
        });
      } else {
        ++round->report.unchanged;
      }
    }
    for (const auto& [unit, spec] : have) {
      if (want->count(unit) != 0) continue;
      ++round->left;
      do_unassign(group, unit, false, [round, unit = unit, one_done](Result<bool> ur) {
        if (!ur.ok()) {
          round->report.failed.emplace_back(unit, ur.error());
        } else if (*ur) {
          ++round->report.unassigned;
        }
        one_done();
      });
    }
    round->issued = true;
    one_done();
  });
}

void Coordinator::Impl::finish_sync(const std::string& group, Result<SyncReport> r) {
  auto it = syncs_.find(group);
  if (it == syncs_.end()) return;
  SyncState& st = it->second;
  st.in_flight = false;
  for (auto& w : st.round_waiters) w.set_result(r);
  st.round_waiters.clear();
  if (halted_ || phase_ != Phase::running) {
    for (auto& w : st.waiters) w.set_error(shutting_down_error());
    st.waiters.clear();
    return;
  }
  if (st.again || !st.waiters.empty()) {
    run_sync(group);
    return;
  }
  if (st.periodic) schedule_sync(group);
}

void Coordinator::Impl::schedule_sync(const std::string& group) {
  SyncState& st = syncs_.at(group);
  st.timer->expires_after(s_.sync_interval);
  st.timer->async_wait([this, group](const asio::error_code& ec) {
    if (ec || halted_ || phase_ != Phase::running) return;
    run_sync(group);
  });
}

}  // namespace troupe::cluster
