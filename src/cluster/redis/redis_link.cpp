// The coordinator's link to Redis: connecting its connections (commands,
// the subscription to the cluster's notices, and heartbeats), loading the Lua scripts,
// reconnecting with back-off, running a script (EVALSHA, with EVAL when
// Redis lost its script cache) and checking its reply's shape, and the
// notices that make this node read its assignments again.

#include "coordinator_impl.hpp"

namespace troupe::cluster {

// --- the link to Redis ------------------------------------------------------------

void Coordinator::Impl::connect_link(std::function<void(Result<void>)> done) {
  connecting_link_ = true;
  auto fail = [this, done](const Error& e) {
    connecting_link_ = false;
    cmd_.close();
    sub_.close();
    done(e);
  };
  cmd_.connect([this, done, fail](Result<void> r) {
    if (halted_) return;
    if (!r.ok()) return fail(r.error());
    load_scripts([this, done, fail](Result<void> lr) {
      if (halted_) return;
      if (!lr.ok()) return fail(lr.error());
      sub_.connect([this, done, fail](Result<void> sr) {
        if (halted_) return;
        if (!sr.ok()) return fail(sr.error());
        sub_.subscribe(
            keys_.events(), [this](std::string_view payload) { on_event(payload); },
            [this, done, fail](Result<void> subr) {
              if (halted_) return;
              if (!subr.ok()) return fail(subr.error());
              if (!cmd_.ready() || !sub_.ready())
                return fail(
                    Error(ErrorCode::coordination_failed,
                          "the connection to Redis at " + endpoint_.describe() + " broke while connecting"));
              auto up = [this, done] {
                connecting_link_ = false;
                link_up_ = true;
                done({});
              };
              // Reconnecting after the other two were lost: the heartbeat
              // connection has its own loop.
              if (beat_.ready() || beat_connecting_) return up();
              connect_beat([this, up, fail](Result<void> br) {
                if (halted_) return;
                if (!br.ok()) return fail(br.error());
                up();
              });
            });
      });
    });
  });
}

void Coordinator::Impl::load_scripts(std::function<void(Result<void>)> done) {
  struct Batch {
    std::size_t left = detail::script_count;
    std::optional<Error> error;
  };
  auto batch = std::make_shared<Batch>();
  for (std::size_t i = 0; i < detail::script_count; ++i) {
    auto s = static_cast<Script>(i);
    cmd_.command({"SCRIPT", "LOAD", detail::script_text(s)}, [this, s, i, batch, done](Reply r) {
      if (!r.ok()) {
        if (!batch->error) batch->error = r.error();
      } else if (r->is_error() || !r->is_text()) {
        if (!batch->error)
          batch->error = Error(ErrorCode::coordination_failed,
                               "Redis at " + endpoint_.describe() + " refused to load script " +
                                   std::string(detail::script_name(s)) + ": " + r->describe());
      } else {
        sha_[i] = r->str;
      }
      if (--batch->left == 0) {
        if (batch->error) {
          done(*batch->error);
        } else {
          done({});
        }
      }
    });
  }
}

void Coordinator::Impl::on_link_lost(const Error& e) {
  if (halted_ || connecting_link_ || !link_up_) return;
  link_up_ = false;
  log(CoordinatorLogLevel::warning, "lost Redis: " + e.message() + "; reconnecting");
  link_warned_ = true;
  cmd_.close();
  sub_.close();
  schedule_reconnect();
}

void Coordinator::Impl::schedule_reconnect() {
  reconnect_later(
      reconnect_timer_, backoff_, [this] { return !link_up_ && !connecting_link_; },
      [this](std::function<void(Result<void>)> done) { connect_link(std::move(done)); },
      [this] {
        log(CoordinatorLogLevel::info, "reconnected to Redis at " + endpoint_.describe());
        link_warned_ = false;
        send_beat();
        // Notices published while the subscription was down are lost: read
        // again rather than trust that nothing happened.
        reconcile_all();
        for (const auto& pr : pending_releases_) do_release(pr.group, pr.unit, pr.epoch, [](Result<bool>) {});
        pending_releases_.clear();
      },
      "reconnect");
}

void Coordinator::Impl::reconnect_later(asio::steady_timer& timer, Duration& backoff, std::function<bool()> needed,
                                        std::function<void(std::function<void(Result<void>)>)> connect,
                                        std::function<void()> up, std::string what) {
  if (halted_ || phase_ == Phase::stopped || phase_ == Phase::idle) return;
  timer.expires_after(backoff);
  timer.async_wait([this, &timer, &backoff, needed, connect, up, what](const asio::error_code& ec) {
    if (ec || halted_ || !needed()) return;
    if (phase_ != Phase::running && phase_ != Phase::stopping) return;
    connect([this, &timer, &backoff, needed, connect, up, what](Result<void> r) {
      if (halted_) return;
      if (!r.ok()) {
        if (detail::is_auth_refusal(r.error())) {
          log_auth_refusal(what, r.error());
        } else {
          log(CoordinatorLogLevel::debug, what + " failed: " + r.error().message());
        }
        backoff = std::min(backoff * 2, s_.reconnect_max_backoff);
        reconnect_later(timer, backoff, needed, connect, up, what);
        return;
      }
      backoff = s_.reconnect_min_backoff;
      if (auth_refused_logged_) {
        auth_refused_logged_ = false;
        log(CoordinatorLogLevel::info, "Redis at " + endpoint_.describe() + " accepts this node's AUTH again");
      }
      up();
    });
  });
}

// Wrong credentials do not heal by retrying, so unlike other reconnect
// failures they are an error line; but the loop retries every back-off, so
// at most one line a minute (the message holds Redis' reply, never the
// password).
void Coordinator::Impl::log_auth_refusal(const std::string& what, const Error& e) {
  TimePoint now = steady_now();
  if (auth_refused_logged_ && now - auth_refused_at_ < std::chrono::minutes(1)) return;
  auth_refused_logged_ = true;
  auth_refused_at_ = now;
  log(CoordinatorLogLevel::error, what + " failed: " + e.message() +
                                      "; without heartbeats this node fences itself until Redis accepts its "
                                      "credentials (reported again in a minute at the earliest)");
}

void Coordinator::Impl::connect_beat(std::function<void(Result<void>)> done) {
  beat_connecting_ = true;
  beat_.connect([this, done](Result<void> r) {
    beat_connecting_ = false;
    if (halted_) return;
    if (!r.ok()) beat_.close();
    done(r);
  });
}

void Coordinator::Impl::on_beat_link_lost(const Error& e) {
  if (halted_ || beat_connecting_) return;
  log(CoordinatorLogLevel::warning, "lost the heartbeat connection to Redis: " + e.message() + "; reconnecting");
  beat_.close();
  schedule_beat_reconnect();
}

void Coordinator::Impl::schedule_beat_reconnect() {
  reconnect_later(
      beat_reconnect_timer_, beat_backoff_, [this] { return !beat_.ready() && !beat_connecting_; },
      [this](std::function<void(Result<void>)> done) { connect_beat(std::move(done)); }, [this] { send_beat(); },
      "heartbeat reconnect");
}

void Coordinator::Impl::eval_on(RedisConnection& conn, Script s, std::vector<std::string> args, ReplyK k) {
  if (phase_ == Phase::stopped) {
    asio::post(io_, [k = std::move(k), e = shutting_down_error()]() mutable { k(e); });
    return;
  }
  if (&conn == &cmd_ && !link_up_ && !connecting_link_ && phase_ != Phase::starting) {
    Error e = phase_ == Phase::idle ? Error(ErrorCode::not_ready, "the coordinator of node '" + s_.node_id +
                                                                      "' is not started; call start() first")
                                    : not_connected_error();
    asio::post(io_, [k = std::move(k), e = std::move(e)]() mutable { k(e); });
    return;
  }
  auto argv = std::make_shared<std::vector<std::string>>();
  argv->reserve(4 + script_keys_.size() + args.size());
  argv->push_back("EVALSHA");
  argv->push_back(sha_[static_cast<std::size_t>(s)]);
  argv->push_back(std::to_string(script_keys_.size()));
  argv->insert(argv->end(), script_keys_.begin(), script_keys_.end());
  argv->push_back(keys_.base());
  for (auto& a : args) argv->push_back(std::move(a));
  conn.command(*argv, [this, &conn, s, argv, k = std::move(k)](Reply r) mutable {
    if (r.ok() && r->is_error() && r->str.compare(0, 8, "NOSCRIPT") == 0) {
      // The script cache was flushed (SCRIPT FLUSH, a failover): send the
      // text, which also loads it again.
      (*argv)[0] = "EVAL";
      (*argv)[1] = detail::script_text(s);
      conn.command(*argv,
                   [this, s, k = std::move(k)](Reply r2) mutable { k(script_reply(s, std::move(r2))); });
      return;
    }
    k(script_reply(s, std::move(r)));
  });
}

Coordinator::Impl::Reply Coordinator::Impl::script_reply(Script s, Reply r) const {
  if (!r.ok()) return r;
  if (r->is_error())
    return Error(ErrorCode::coordination_failed, "Redis at " + endpoint_.describe() + " failed script " +
                                                     std::string(detail::script_name(s)) + ": " + r->str);
  if (!r->is_array() || r->elements.empty() || !r->elements[0].is_text()) return unexpected(s, *r);
  return r;
}

Error Coordinator::Impl::unexpected(Script s, const RedisReply& r) const {
  std::string msg = "unexpected reply from Redis to script " + std::string(detail::script_name(s)) + ": " +
                    r.describe() +
                    (r.is_array() && !r.elements.empty() ? " starting " + r.elements[0].describe() : "");
  log(CoordinatorLogLevel::error, msg);
  return Error(ErrorCode::coordination_failed, msg);
}

// --- notices ------------------------------------------------------------------------

void Coordinator::Impl::on_event(std::string_view payload) {
  auto words = split_words(payload);
  if (words.size() < 2) return;
  const std::string& kind = words[0];
  if (kind == "sync" || kind == "changed" || kind == "moved") {
    reconcile(words[1]);
  } else if (kind == "released") {
    // "released <G> <unit>...": only a node waiting for one of these units
    // has anything to read again (or one whose read is out: its answer
    // may predate the release).
    auto it = served_.find(words[1]);
    if (it == served_.end()) return;
    if (it->second.in_flight) {
      reconcile(words[1]);
      return;
    }
    for (std::size_t i = 2; i < words.size(); ++i) {
      if (it->second.awaited.count(words[i]) != 0) {
        reconcile(words[1]);
        return;
      }
    }
  }
  // "left <member>": the next heartbeat's view shows it.
}

}  // namespace troupe::cluster
