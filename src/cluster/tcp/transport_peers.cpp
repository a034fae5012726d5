// The TCP transport's address book: adding, moving and removing peers
// (set_peer, remove_peer, a node that dials before anyone named it), what
// connected() and peers() report, and the back-off between dials to a peer
// this node dials. See transport_impl.hpp for the threads and locks.

#include "transport_impl.hpp"  // first: it includes Asio first

#include "troupe/cluster/node_id.hpp"

namespace troupe::cluster {

// --- address book ----------------------------------------------------------------

void Transport::Impl::set_peer(std::string node, std::string host, std::uint16_t port) {
  if (stopped_.load()) return;
  if (auto valid = validate_node_id(node); !valid.ok()) {
    log("set_peer ignored: " + valid.error().message());
    return;
  }
  if (node == s_.node_id) {
    log("set_peer ignored: '" + node + "' is this node");
    return;
  }
  PeerPtr p;
  bool changed = false;
  {
    std::unique_lock lk(peers_mu_);
    auto it = peers_.find(node);
    if (it == peers_.end()) {
      const bool dials = s_.node_id < node;
      p = std::make_shared<Peer>(io_, node, dials);
      p->host = std::move(host);
      p->port = port;
      peers_.emplace(std::move(node), p);
      changed = true;
    } else {
      p = it->second;
      std::lock_guard pl(p->mu);
      if (p->host != host || p->port != port) {
        p->host = std::move(host);
        p->port = port;
        changed = true;
      }
    }
  }
  if (changed && p->dials) asio::post(io_, [this, p] { on_address(p); });
}

// A node that dialled us before anyone gave its address: a peer we answer
// but never dial (its id is the smaller one: it dials us).
Transport::Impl::PeerPtr Transport::Impl::add_unaddressed(std::string node) {
  std::unique_lock lk(peers_mu_);
  auto it = peers_.find(node);
  if (it != peers_.end()) return it->second;
  auto p = std::make_shared<Peer>(io_, node, false);
  peers_.emplace(std::move(node), p);
  return p;
}

// A new peer, or a new address: dial now unless a connection is already
// being made or up (a moved node drops its old connection, which redials).
void Transport::Impl::on_address(const PeerPtr& p) {
  if (stopped_.load() || p->conn) return;
  ++p->redial_gen;
  if (p->redial_armed) {
    p->redial_armed = false;
    p->redial.cancel();
  }
  dial(p);
}

void Transport::Impl::remove_peer(std::string_view node) {
  PeerPtr p;
  {
    std::unique_lock lk(peers_mu_);
    auto it = peers_.find(node);
    if (it == peers_.end()) return;
    p = it->second;
    peers_.erase(it);
  }
  std::uint64_t dropped = 0;
  {
    std::lock_guard pl(p->mu);
    p->removed = true;
    p->ready = false;
    p->direct = false;
    p->partial_rest = 0;
    dropped = p->pending_frames;
    p->pending_frames = 0;
    std::string().swap(p->pending);
  }
  bump(c_.frames_dropped, dropped);
  asio::post(io_, [this, p] { forget(p); });
}

void Transport::Impl::forget(const PeerPtr& p) {
  ++p->redial_gen;
  p->redial_armed = false;
  p->redial.cancel();
  if (p->conn) close(p->conn, "node removed from the address book");
}

bool Transport::Impl::connected(std::string_view node) const {
  PeerPtr p = find(node);
  if (!p) return false;
  std::lock_guard pl(p->mu);
  return p->ready;
}

std::vector<PeerStatus> Transport::Impl::peers() const {
  std::vector<PeerStatus> out;
  std::shared_lock lk(peers_mu_);
  out.reserve(peers_.size());
  for (const auto& [id, p] : peers_) {
    std::lock_guard pl(p->mu);
    out.push_back(PeerStatus{.node_id = id,
                             .host = p->host,
                             .port = p->port,
                             .dials = p->dials,
                             .connected = p->ready,
                             .incarnation = p->incarnation,
                             .outbound_bytes = p->pending.size() + p->in_flight});
  }
  return out;
}

// --- redial back-off (io thread) -----------------------------------------------

void Transport::Impl::schedule_redial(const PeerPtr& p) {
  if (p->redial_armed || p->conn) return;
  // reconnect_min doubled per failure since the last handshake, capped;
  // the first redial after a working connection waits reconnect_min.
  Duration base = s_.reconnect_min;
  for (int i = 1; i < p->failures && base < s_.reconnect_max; ++i) base *= 2;
  base = std::min(base, s_.reconnect_max);
  // Jitter: somewhere in [base/2, base], so nodes that lost each other at
  // the same moment do not redial in lockstep.
  const auto half = base.count() / 2;
  std::uniform_int_distribution<Duration::rep> jitter(0, half);
  const Duration delay(base.count() - jitter(rng_));
  const std::uint64_t gen = ++p->redial_gen;
  p->redial_armed = true;
  p->redial.expires_after(delay);
  p->redial.async_wait([this, p, gen](const std::error_code& ec) {
    if (ec || gen != p->redial_gen) return;
    p->redial_armed = false;
    if (stopped_.load()) return;
    bump(c_.reconnects);
    dial(p);
  });
}

}  // namespace troupe::cluster
