// The parts of a shard region that do not depend on its entity type: the
// checks ShardRegion::start makes, the errors a region answers refused
// commands with, the coordinator group of a type, and the sum of entity
// stats over shards.

#include <string>
#include <string_view>

#include "troupe/cluster/sharding.hpp"

namespace troupe::cluster::detail {

std::string shard_group(std::string_view type) { return "shards/" + std::string(type); }

Result<void> check_region(const ShardRegionSettings& settings, const RegionParts& parts) {
  auto bad = [](std::string m) { return Error(ErrorCode::invalid_argument, std::move(m)); };
  const std::string& type = settings.entity.type_name;
  if (type.empty() || type.find('|') != std::string::npos) return bad("entity type name '" + type + "' is empty or contains '|'");
  if (settings.shard_count == 0) return bad("entity type '" + type + "': shard_count is 0");
  if (settings.buffer_per_shard == 0) return bad("entity type '" + type + "': buffer_per_shard is 0");
  if (!parts.message_codecs) return bad("entity type '" + type + "': no message codecs registered");
  if (!parts.journal) return bad("entity type '" + type + "': no journal");
  if (!parts.event_codecs) return bad("entity type '" + type + "': no event codecs registered");
  if (settings.entity.stash_capacity == 0) return bad("entity type '" + type + "': stash capacity is 0");
  if (settings.entity.snapshot_every && !parts.state_codec) return bad("entity type '" + type + "': snapshot_every needs a state codec");
  if (!parts.can_build_behaviour)
    return bad("entity type '" + type + "': no factory and the behaviour has no default constructor");
  return {};
}

Error region_hops_error(const std::string& type, const std::string& id, std::uint8_t hops) {
  return Error(ErrorCode::unreachable, "entity '" + type + "|" + id + "': forwarded " + std::to_string(hops) +
                                           " times without reaching its shard's owner");
}

Error region_stopping_error(const std::string& type, const std::string& node) {
  return Error(ErrorCode::shutting_down, "entity type '" + type + "' is stopping on node '" + node + "'");
}

Error region_buffer_full_error(const std::string& type, const std::string& id, std::size_t buffer) {
  return Error(ErrorCode::buffer_overflow, "entity '" + type + "|" + id + "': " + std::to_string(buffer) +
                                               " commands already wait for its shard's owner");
}

Error region_system_stopping_error(const std::string& node) {
  return Error(ErrorCode::shutting_down, "the actor system of node '" + node + "' is shutting down");
}

void add_entity_stats(EntityStats& to, const EntityStats& e) {
  to.incarnations_started += e.incarnations_started;
  to.active += e.active;
  to.passivations += e.passivations;
  to.recoveries += e.recoveries;
  to.recovery_failures += e.recovery_failures;
  to.events_persisted += e.events_persisted;
  to.snapshots_saved += e.snapshots_saved;
  to.processing_timeouts += e.processing_timeouts;
  to.stale_deadlines += e.stale_deadlines;
  to.stops_deferred += e.stops_deferred;
  to.stash_overflows += e.stash_overflows;
  to.missing_replies += e.missing_replies;
  to.journal_conflicts += e.journal_conflicts;
  to.journal_failures += e.journal_failures;
  to.commands_failed += e.commands_failed;
  to.commands_dropped += e.commands_dropped;
  to.handler_failures += e.handler_failures;
}

}  // namespace troupe::cluster::detail
