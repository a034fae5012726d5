#pragma once
// A command's path through a shard region (sharding.hpp): to the local
// registry, over the owner's connection, or into the shard's buffer; the
// re-send of an idempotent ask whose owner was lost (SPEC C1); and the
// inbox through which commands from other nodes arrive. Members of
// RegionCore (region_core.hpp).

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "troupe/cluster/detail/region_core.hpp"
#include "troupe/cluster/detail/shard_header.hpp"
#include "troupe/cluster/messages.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/core/log.hpp"

namespace troupe::cluster::detail {

// Routes a command to its entity from any thread.
template <class B>
void RegionCore<B>::route(std::string id, Command cmd, std::uint8_t hops) {
  if (hops > settings.max_hops) {
    refuse(cmd, region_hops_error(settings.entity.type_name, id, hops));
    return;
  }
  std::uint32_t s = shard_of(id, settings.shard_count);
  Shard& sh = shards[s];
  std::unique_lock lk(sh.mu);
  route_locked(lk, sh, s, std::move(id), std::move(cmd), hops, false);
}

template <class B>
void RegionCore<B>::route_locked(std::unique_lock<std::mutex>& lk, Shard& sh, std::uint32_t s, std::string id,
                                  Command cmd, std::uint8_t hops, bool resent_cmd) {
  switch (sh.phase) {
    case Phase::local:
      return deliver_local(sh, std::move(id), std::move(cmd));
    case Phase::remote:
      return send_remote(sh, s, std::move(id), std::move(cmd), hops);
    case Phase::unknown:
      if (!hold(sh, std::move(id), std::move(cmd), hops, resent_cmd)) return;
      sh.phase = Phase::locating;
      lk.unlock();
      return locate(s);
    case Phase::locating:
    case Phase::waiting:
    case Phase::stopping:
      (void)hold(sh, std::move(id), std::move(cmd), hops, resent_cmd);
      return;
  }
}

template <class B>
bool RegionCore<B>::hold(Shard& sh, std::string id, Command cmd, std::uint8_t hops, bool resent_cmd) {
  if (stopping.load(std::memory_order_acquire)) {
    refuse(cmd, region_stopping_error(settings.entity.type_name, directory->self()));
    return false;
  }
  if (sh.buffer.size() >= settings.buffer_per_shard) {
    refuse(cmd, region_buffer_full_error(settings.entity.type_name, id, settings.buffer_per_shard));
    return false;
  }
  sh.buffer.push_back(Pending{std::move(id), std::move(cmd), hops, resent_cmd});
  buffered.fetch_add(1, std::memory_order_relaxed);
  return true;
}

template <class B>
void RegionCore<B>::deliver_local(Shard& sh, std::string id, Command cmd) {
  // The registry answers a command it refuses (stopping) through its reply
  // target, so nothing more to do on error.
  (void)sh.host->tell(id, std::move(cmd));
}

// With sh.mu held and a phase of remote.
template <class B>
void RegionCore<B>::send_remote(Shard& sh, std::uint32_t s, std::string id, Command cmd, std::uint8_t hops) {
  TROUPE_LOG(log::Component::cluster, log::Level::debug, "command sent to the shard's owner",
             {{"entity", settings.entity.type_name + "|" + id}, {"owner", sh.owner}, {"shard", s}});
  // An ask is kept whole until it is on its way: one that finds its owner
  // gone from the address book was not sent, so it waits for the next
  // owner whether or not it is idempotent.
  if (reply_pending(cmd)) return send_ask(sh, s, std::move(id), std::move(cmd), hops);
  ByteWriter& w = scratch_writer();
  std::size_t id_at = begin_frame(w, s, hops, id);
  std::optional<PendingReply> reply;
  auto msg_id = codecs.encode(cmd, w, reply);
  if (!msg_id.ok()) {
    refuse(cmd, msg_id.error());
    return;
  }
  auto& b = w.bytes();
  patch(b, id_at, msg_id.value(), 4);
  sent_remote.fetch_add(1, std::memory_order_relaxed);
  Result<void> sent;
  if (reply) {
    std::uint64_t req = add_pending(remoting->core(), sh.owner, std::move(*reply), ask_forget_after);
    patch(b, 0, req, 8);
    sent = send_frame(remoting->core(), sh.owner, RemoteKind::entity_ask, b);
    if (!sent.ok()) fail_pending(remoting->core(), req, sent.error());
  } else {
    // A tell carries no request id: skip the 8 placeholder bytes.
    sent = send_frame(remoting->core(), sh.owner, RemoteKind::entity_tell, std::string_view(b).substr(8));
    // Not sent because its owner left: it waits for the next one.
    if (!sent.ok() && sent.error().code() == ErrorCode::unreachable) {
      (void)hold(sh, std::move(id), std::move(cmd), hops);
    } else if (!sent.ok()) {
      refused.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (sent.ok()) {
    sh.relocate_delay = Duration::zero();
  } else if (sent.error().code() == ErrorCode::unreachable) {
    owner_gone(sh, s);
  }
}

// With sh.mu held and a phase of remote; `cmd` has a pending reply target.
template <class B>
void RegionCore<B>::send_ask(Shard& sh, std::uint32_t s, std::string id, Command cmd, std::uint8_t hops) {
  ByteWriter& w = scratch_writer();
  std::size_t id_at = begin_frame(w, s, hops, id);
  auto msg_id = codecs.encode(std::as_const(cmd), w);
  if (!msg_id.ok()) {
    refuse(cmd, msg_id.error());
    return;
  }
  auto flight = std::make_shared<InFlight>();
  flight->id = std::move(id);
  flight->owner = sh.owner;
  flight->shard = s;
  flight->hops = hops;
  flight->cmd.emplace(std::move(cmd));
  std::weak_ptr<RegionCore> self = this->shared_from_this();
  std::uint64_t req = add_pending(
      remoting->core(), sh.owner,
      [self, flight](Result<std::string_view> r) { answered(self, *flight, std::move(r)); }, ask_forget_after);
  auto& b = w.bytes();
  patch(b, id_at, msg_id.value(), 4);
  patch(b, 0, req, 8);
  sent_remote.fetch_add(1, std::memory_order_relaxed);
  auto sent = send_frame(remoting->core(), sh.owner, RemoteKind::entity_ask, b);
  if (sent.ok()) {
    sh.relocate_delay = Duration::zero();
    return;
  }
  // Not sent. Unless the remoting layer completed it meanwhile (its node
  // was removed on another thread, which re-sends it), take it back.
  if (!flight->claim()) return;
  Command back = std::move(*flight->cmd);
  fail_pending(remoting->core(), req, sent.error());  // forgets it; the reply function finds it claimed
  if (sent.error().code() != ErrorCode::unreachable) {
    refuse(back, sent.error());
    return;
  }
  // Its owner is gone from the address book: nothing went out, so it
  // waits for the shard's next owner like any new command.
  (void)hold(sh, std::move(flight->id), std::move(back), hops, true);
  owner_gone(sh, s);
}

// The answer to an ask sent by send_ask, or the failure that ended it.
template <class B>
void RegionCore<B>::answered(const std::weak_ptr<RegionCore>& self, InFlight& f, Result<std::string_view> r) {
  // Read first: only the remoting layer failing a lost connection's or a
  // departed node's requests means "the owner went away meanwhile".
  bool lost = !r.ok() && r.error().code() == ErrorCode::unreachable && completing_lost_requests();
  // The owner's node has no region of this type published: it is still
  // starting (placement gave it the shard as soon as it joined). The ask
  // was not delivered, so it goes to whoever placement names, a little
  // later.
  bool undelivered = !r.ok() && r.error().code() == ErrorCode::dead_letter &&
                     r.error().message().starts_with("nothing is published as");
  if (!f.claim()) return;
  Command& cmd = *f.cmd;
  auto core = self.lock();
  if (!core) {
    fail_reply_target(cmd, r.ok() ? Error(ErrorCode::shutting_down, "the shard region is stopped") : r.error());
    return;
  }
  // Lost, only an idempotent ask may go again: any other may have been
  // handled, and its asker gets the "may or may not" error.
  if ((lost && core->codecs.idempotent(cmd)) || undelivered) {
    troupe::detail::BorrowedTraceScope scope(f.trace);
    return core->resend(f, std::move(cmd), std::move(r).error(), undelivered);
  }
  core->codecs.answer(cmd, std::move(r));
}

// Sends an ask again after its owner died or left while it was out (an
// idempotent one), or after its owner's node had no region to take it;
// `lost` is what its asker gets if it cannot be.
template <class B>
void RegionCore<B>::resend(InFlight& f, Command cmd, Error lost, bool later) {
  // Its asker's timeout passed: nobody waits for it any more.
  if (!reply_pending(cmd)) return;
  Shard& sh = shards[f.shard];
  std::unique_lock lk(sh.mu);
  if (stopping.load(std::memory_order_acquire)) {
    lk.unlock();
    refuse(cmd, lost);
    return;
  }
  resent.fetch_add(1, std::memory_order_relaxed);
  // The first of the shard's asks to hear of the loss: the shard is
  // located again rather than sent to the same node. A node still
  // starting (`later`) most likely still owns it: located after a pause.
  if (sh.phase == Phase::remote && sh.owner == f.owner) {
    if (later) {
      (void)hold(sh, std::move(f.id), std::move(cmd), f.hops, true);
      owner_gone(sh, f.shard);
      return;
    }
    sh.phase = Phase::unknown;
    sh.owner.clear();
  }
  route_locked(lk, sh, f.shard, std::move(f.id), std::move(cmd), f.hops, true);
}

// A frame of the entity kinds from another node.
template <class B>
Result<void> RegionCore<B>::on_remote(std::string_view from, std::string_view rest, std::optional<ReplySink> sink) {
  auto header = parse_shard_header(rest, settings.shard_count, from);
  if (!header.ok()) {
    if (sink) (*sink)(ReplyBytes(header.error()));
    return std::move(header).error();
  }
  auto& [s, hops, id, msg_id, body] = header.value();
  auto cmd = codecs.decode(msg_id, body, sink ? &*sink : nullptr);
  if (!cmd.ok()) {
    if (sink) (*sink)(ReplyBytes(cmd.error()));
    return std::move(cmd).error();
  }
  received_remote.fetch_add(1, std::memory_order_relaxed);
  TROUPE_LOG(log::Component::cluster, log::Level::debug, "command from another node",
             {{"entity", settings.entity.type_name + "|" + id}, {"from", from}, {"shard", s}});
  {
    Shard& sh = shards[s];
    std::lock_guard lk(sh.mu);
    if (sh.phase == Phase::remote && sh.owner == from) {
      // The node this one takes for the owner sent it here: it no longer
      // owns the shard (it handed it off, most likely to this node). Sent
      // back, the command would bounce until it ran out of hops: the owner
      // is looked up again instead, and it waits for it.
      sh.phase = Phase::unknown;
      sh.owner.clear();
    } else if (sh.phase == Phase::remote) {
      forwarded.fetch_add(1, std::memory_order_relaxed);
    }
  }
  route(std::move(id), std::move(cmd.value()), static_cast<std::uint8_t>(hops + 1));
  return {};
}

// Where frames for a region arrive from other nodes: entity frames go to
// the region, if it still exists; actor frames are refused.
template <class B>
class RegionInbox final : public Inbox {
 public:
  explicit RegionInbox(std::weak_ptr<RegionCore<B>> c) : core_(std::move(c)) {}
  Result<void> deliver(std::string_view, std::uint32_t, std::string_view, std::optional<ReplySink> sink) override {
    Error e(ErrorCode::protocol_error, "an actor frame for a shard region");
    if (sink) (*sink)(ReplyBytes(e));
    return e;
  }
  Result<void> deliver_entity(std::string_view from, std::string_view rest, std::optional<ReplySink> sink) override {
    auto c = core_.lock();
    if (!c) {
      Error e(ErrorCode::shutting_down, "the shard region is stopped");
      if (sink) (*sink)(ReplyBytes(e));
      return e;
    }
    return c->on_remote(from, rest, std::move(sink));
  }

 private:
  std::weak_ptr<RegionCore<B>> core_;
};

}  // namespace troupe::cluster::detail
