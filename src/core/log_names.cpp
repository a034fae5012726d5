// The names of log levels and components (troupe/core/log.hpp), apart from
// the writing so that a configuration parser can use them alone.

#include <iterator>

#include "troupe/core/log.hpp"

namespace troupe::log {
namespace {

constexpr std::string_view kLevelNames[] = {"trace", "debug", "info", "warn", "error", "off"};
constexpr std::string_view kComponentNames[] = {"core", "net", "persist", "patterns", "cluster", "node", "app"};
static_assert(std::size(kComponentNames) == kComponents);

}  // namespace

std::string_view to_string(Level l) noexcept { return kLevelNames[static_cast<std::size_t>(l)]; }
std::string_view to_string(Component c) noexcept { return kComponentNames[static_cast<std::size_t>(c)]; }

std::optional<Level> parse_level(std::string_view name) noexcept {
  if (name == "warning") return Level::warn;
  for (std::size_t i = 0; i < std::size(kLevelNames); ++i)
    if (kLevelNames[i] == name) return static_cast<Level>(i);
  return std::nullopt;
}

std::optional<Component> parse_component(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kComponents; ++i)
    if (kComponentNames[i] == name) return static_cast<Component>(i);
  return std::nullopt;
}

}  // namespace troupe::log
