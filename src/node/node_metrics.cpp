// The node's /metrics families: the actor system, the entity types, the
// journal and its outbox, locks, process managers, job services, watched
// services and the cluster, each labelled with the node's id (doc/node.md,
// "Metrics").

#include <map>

#include "node_impl.hpp"

namespace troupe::node {

namespace {

// The outbox dispatcher's families. The journal's counts only once read.
void collect_outbox(MetricsWriter& w, const OutboxStats& st, const Labels& l) {
  auto d = [](std::uint64_t v) { return static_cast<double>(v); };
  if (st.pending) w.gauge("troupe_outbox_pending", "Side effects stored and not yet done (in flight included).").set(l, d(*st.pending));
  if (st.failed) w.gauge("troupe_outbox_failed", "Side effects given up after their last try, kept in the journal.").set(l, d(*st.failed));
  w.gauge("troupe_outbox_in_flight", "Side effects this node is trying now.").set(l, d(st.in_flight));
  w.counter("troupe_outbox_sent_total", "Side effects this node ran to success.").set(l, d(st.sent));
  w.counter("troupe_outbox_retries_total", "Failed tries this node will try again after a back-off.").set(l, d(st.retries));
  w.counter("troupe_outbox_failures_total", "Side effects this node gave up on (kept as failed).").set(l, d(st.failures));
  w.counter("troupe_outbox_timeouts_total", "Tries that had no answer within the attempt timeout.").set(l, d(st.timeouts));
  w.counter("troupe_outbox_journal_errors_total", "Outbox claims, settlements and counts the journal refused.").set(l, d(st.journal_errors));
}

// The cluster port's defences: peers refused, by reason, and TLS reloads.
void collect_transport(MetricsWriter& w, const cluster::TransportStats& st, const Labels& node_label) {
  auto d = [](std::uint64_t v) { return static_cast<double>(v); };
  auto with = [&](const char* reason) {
    Labels l = node_label;
    l.emplace_back("reason", reason);
    return l;
  };
  const cluster::RefusedPeerCounts& r = st.refused_peers;
  auto& refused = w.counter("troupe_cluster_peers_refused_total",
                            "Connections to the cluster port refused before their HELLO was accepted, by reason.");
  refused.set(with("tls_handshake"), d(r.tls_handshake));
  refused.set(with("no_certificate"), d(r.no_certificate));
  refused.set(with("untrusted_certificate"), d(r.untrusted_certificate));
  refused.set(with("name_mismatch"), d(r.name_mismatch));
  refused.set(with("over_address_limit"), d(r.over_address_limit));
  refused.set(with("over_total_limit"), d(r.over_total_limit));
  refused.set(with("handshake_timeout"), d(st.closed_for_bad_input.handshake_timeout));
  w.counter("troupe_cluster_bad_input_total", "Cluster connections closed for what the peer sent (doc/wire.md).")
      .set(node_label, d(st.closed_for_bad_input.total() - st.closed_for_bad_input.handshake_timeout));
  w.counter("troupe_cluster_tls_reloads_total", "Reloads of the cluster's TLS files that took effect.")
      .set(node_label, d(st.tls_reloads));
  w.counter("troupe_cluster_tls_reload_failures_total", "Reloads of the cluster's TLS files refused (the old stay).")
      .set(node_label, d(st.tls_reload_failures));
}

}  // namespace

void Node::Impl::collect(MetricsWriter& w) const {
  const Labels node_label{{"node", node->config_.id}};
  auto sys = node->system_->stats();
  auto with = [&](Labels extra) {
    Labels l = node_label;
    l.insert(l.end(), extra.begin(), extra.end());
    return l;
  };
  auto d = [](std::uint64_t v) { return static_cast<double>(v); };
  w.gauge("troupe_up", "1 while the node runs.").set(node_label, 1);
  w.gauge("troupe_ready", "1 while the node takes work (see /ready).").set(node_label, ready.load() ? 1 : 0);
  w.gauge("troupe_actors", "Actors alive.").set(node_label, d(sys.actors_live));
  w.gauge("troupe_mailbox_depth", "User messages waiting in mailboxes (or being handled).").set(node_label, d(sys.mailbox_depth));
  w.gauge("troupe_runnable_actors", "Actors with messages, waiting for a worker thread.").set(node_label, d(sys.runnable_actors));
  w.counter("troupe_messages_delivered_total", "User messages accepted into mailboxes.").set(node_label, d(sys.messages_delivered));
  w.counter("troupe_messages_processed_total", "User messages taken from mailboxes by their actors.").set(node_label, d(sys.messages_taken));
  w.counter("troupe_dead_letters_total", "Messages that found no live recipient.").set(node_label, d(sys.dead_letters));
  w.counter("troupe_mailbox_overflows_total", "Messages refused by a full bounded mailbox.").set(node_label, d(sys.mailbox_overflows));
  w.counter("troupe_handler_failures_total", "Message handlers that threw.").set(node_label, d(sys.handler_failures));
  w.gauge("troupe_timers_pending", "Timers waiting to fire.").set(node_label, d(sys.timers_pending));
  if (admin) {  // the admin port's own defences (doc/node.md, "Limits")
    const http::ServerStats a = admin->stats();
    w.gauge("troupe_admin_connections", "Connections open on the admin port.").set(node_label, d(a.connections_open));
    auto& refused = w.counter("troupe_admin_connections_refused_total",
                              "Admin port connections closed at once: over max_connections (limit=total) or "
                              "max_connections_per_address (limit=per_address).");
    refused.set(with({{"limit", "total"}}), d(a.connections_refused));
    refused.set(with({{"limit", "per_address"}}), d(a.connections_refused_per_address));
    w.counter("troupe_admin_timeouts_total", "Admin port connections closed by a read, idle or TLS handshake time limit.")
        .set(node_label, d(a.timeouts));
    w.counter("troupe_admin_tls_handshakes_failed_total", "Admin port TLS handshakes that failed or timed out.")
        .set(node_label, d(a.tls_handshakes_failed));
  }

  std::vector<EntityTypeView> ts;
  std::vector<std::pair<std::string, KeyedLock>> ls;
  std::vector<std::pair<std::string, std::function<ProcessStats()>>> ms;
  std::vector<std::pair<std::string, JobService>> js;
  std::optional<OutboxDispatcher> ob;
  {
    std::lock_guard lk(mu);
    ts = types;
    ls = locks;
    ms = managers;
    js = jobs;
    ob = outbox;
  }
  for (const auto& t : ts) {
    auto st = t.stats();
    Labels l = with({{"type", t.type}});
    w.gauge("troupe_entities_active", "Entities in memory, per type.").set(l, d(st.active));
    w.counter("troupe_entities_passivated_total", "Entities passivated (left memory when idle), per type.").set(l, d(st.passivations));
    w.counter("troupe_entities_started_total", "Entity incarnations started, per type.").set(l, d(st.incarnations_started));
    w.gauge("troupe_entities_processing", "Entities in a processing episode now, per type.").set(l, d(t.processing_count()));
    w.counter("troupe_events_persisted_total", "Events stored, per entity type.").set(l, d(st.events_persisted));
    w.counter("troupe_processing_timeouts_total", "Processing deadlines handled, per type.").set(l, d(st.processing_timeouts));
    w.counter("troupe_stale_deadlines_total", "Deadlines of ended episodes, ignored, per type.").set(l, d(st.stale_deadlines));
    w.counter("troupe_entity_commands_failed_total", "Commands the runtime answered with an error, per type.").set(l, d(st.commands_failed));
    w.counter("troupe_journal_conflicts_total", "Appends refused because another writer holds the entity, per type.").set(l, d(st.journal_conflicts));
    w.gauge("troupe_shards_hosted", "Shards of the type hosted on this node.").set(l, d(t.shards_hosted()));
    w.counter("troupe_shards_started_total",
              "Shards of the type started on this node: at start, by a move or by a takeover from a dead member.")
        .set(l, d(t.shards_started()));
  }
  if (metered) {
    Labels l = with({{"backend", std::string(metered->name())}});
    w.counter("troupe_journal_appends_total", "Append calls (one entity's batch each).").set(l, d(metered->meters().appends.load()));
    w.counter("troupe_journal_events_total", "Events handed to the journal.").set(l, d(metered->meters().events.load()));
    w.counter("troupe_journal_append_failures_total", "Appends that failed.").set(l, d(metered->meters().failures.load()));
    if (auto c = metered->commits()) {
      w.counter("troupe_journal_transactions_total", "Write transactions committed (group commits).").set(l, d(c->first));
      w.counter("troupe_journal_transaction_events_total", "Events written by those transactions: over transactions, the batch size.").set(l, d(c->second));
    }
  }
  if (ob) collect_outbox(w, ob->stats(), node_label);
  for (const auto& [name, lock] : ls) {
    auto st = lock.stats();
    Labels l = with({{"lock", name}});
    w.counter("troupe_lock_grants_total", "Keyed lock blocks started.").set(l, d(st.grants));
    w.counter("troupe_lock_waits_total", "Lock requests that queued behind a holder.").set(l, d(st.waits));
    w.counter("troupe_lock_acquire_timeouts_total", "Lock requests answered acquire_timeout.").set(l, d(st.acquire_timeouts));
    w.counter("troupe_lock_lease_expiries_total", "Lock holders that ran past their lease.").set(l, d(st.lease_expiries));
    w.gauge("troupe_lock_waiting", "Lock requests queued now.").set(l, d(st.waiting));
    w.gauge("troupe_lock_keys", "Keys with lock state now.").set(l, d(st.live_keys));
  }
  for (const auto& [name, f] : ms) {
    auto st = f();
    Labels l = with({{"manager", name}});
    w.gauge("troupe_process_running", "Processes running now.").set(l, d(st.running));
    w.gauge("troupe_process_buffered", "Requests waiting for a process slot.").set(l, d(st.buffered));
    w.counter("troupe_process_refused_total", "Requests refused at once (buffer full).").set(l, d(st.refused));
    w.counter("troupe_process_completed_total", "Processes that completed.").set(l, d(st.completed));
    w.counter("troupe_process_failed_total", "Processes that failed.").set(l, d(st.failed));
  }
  for (const auto& [name, service] : js) {
    auto st = service.stats();
    Labels l = with({{"service", name}});
    auto& depth = w.gauge("troupe_jobs_queued", "Jobs ready to run, per priority.");
    if (st.queued_by_priority.empty()) depth.set(with({{"service", name}, {"priority", "0"}}), 0);
    for (const auto& lv : st.queued_by_priority)
      depth.set(with({{"service", name}, {"priority", std::to_string(lv.priority)}}), d(lv.depth));
    w.gauge("troupe_jobs_active", "Worker slots running a job.").set(l, d(st.active));
    w.gauge("troupe_jobs_waiting_retry", "Jobs waiting out a back-off.").set(l, d(st.waiting_retry));
    auto& outcomes = w.counter("troupe_jobs_outcomes_total", "Jobs finished, by final outcome.");
    outcomes.set(with({{"service", name}, {"outcome", "succeeded"}}), d(st.succeeded));
    outcomes.set(with({{"service", name}, {"outcome", "failed"}}), d(st.failed));
    outcomes.set(with({{"service", name}, {"outcome", "timed_out"}}), d(st.timed_out));
    w.counter("troupe_jobs_retried_total", "Job attempts retried.").set(l, d(st.retried));
    w.counter("troupe_jobs_refused_total", "Jobs refused at submit (queue full).").set(l, d(st.refused));
  }
  collect_projections(w, node_label);
  auto health = check_health();
  if (!health.empty()) {
    auto& up = w.gauge("troupe_service_up", "1 while a watched service works, 0 while it reports a failure (see /health).");
    for (const auto& [name, r] : health) up.set(with({{"service", name}}), r.ok() ? 1 : 0);
  }
  if (auto* c = node->cluster_.get()) {
    auto members = c->coordinator().members();
    w.gauge("troupe_cluster_members", "Live members of the cluster, as this node sees them.").set(node_label, d(members.size()));
    w.gauge("troupe_cluster_fenced", "1 while this node has lost its lease.").set(node_label, c->coordinator().is_fenced() ? 1 : 0);
    std::uint64_t departed = 0;
    {
      std::lock_guard lk(mu);
      departed = members_departed;
    }
    w.counter("troupe_cluster_members_departed_total",
              "Members that left or were declared dead since this node started (each a failover or a drain).")
        .set(node_label, d(departed));
    std::map<std::string, std::uint64_t> per_owner;
    json map;
    {
      std::lock_guard lk(mu);
      map = shard_map;
    }
    for (const auto& m : members) per_owner[m.id] = 0;
    for (const auto& e : map) per_owner[e["owner"].get<std::string>()] += 1;
    auto& f = w.gauge("troupe_cluster_shards", "Shards per owner node, as last read from the placement store.");
    for (const auto& [owner, n] : per_owner) f.set(with({{"owner", owner}}), d(n));
    collect_transport(w, c->remoting().transport().stats(), node_label);
  } else {
    w.gauge("troupe_cluster_members", "Live members of the cluster, as this node sees them.").set(node_label, 1);
  }
  std::uint64_t recoveries = 0;
  for (const auto& t : ts) recoveries += t.stats().recoveries;
  w.counter("troupe_entity_recoveries_total", "Entity recoveries completed (after passivation, restart or failover).").set(node_label, d(recoveries));
}

}  // namespace troupe::node
