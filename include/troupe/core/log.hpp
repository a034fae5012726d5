#pragma once
// troupe's logging: one facade for the library and the applications on it.
// Lines have a level, a component (the layer that writes them, or `app`),
// a message, structured fields and, when one is current, the trace id
// (troupe/core/trace.hpp). They go out as text or as JSON lines (one object
// per line), to stderr or to a file; spdlog does the writing, inside
// src/core, so nothing of it shows here.
//
//   namespace log = troupe::log;
//   log::info(log::Component::app, "payment settled", {{"payment", id}, {"amount", amount}});
//   TROUPE_LOG(log::Component::app, log::Level::debug, "gateway answered " + text);  // built only if enabled
//
// Text:  2026-11-27T21:03:30.123Z info  persist [4bf92f3577b34da6a3ce929d0e0e4736] processing timed out entity=payment|p1
// JSON:  {"ts":"2026-11-27T21:03:30.123Z","level":"info","component":"persist","msg":"processing timed out",
//         "trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","entity":"payment|p1"}
//
// Each component has its own minimum level (default info). A line below it
// costs one relaxed atomic load: the message and fields are not formatted,
// and with TROUPE_LOG (or an enabled() check) not even built. A node sets
// all of this from its TOML ([log], doc/node.md); a program without a node
// calls configure(), or leaves the default (info, text, stderr).
//
// Thread safety: every function may be called from any thread at any time;
// configure() swaps the destination atomically (a line goes wholly to the
// old or the new one).

#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/core/result.hpp"

namespace troupe::log {

enum class Level : std::uint8_t { trace, debug, info, warn, error, off };

// Who writes a line: troupe's layers, and `app` for applications.
enum class Component : std::uint8_t { core, net, persist, patterns, cluster, node, app };
inline constexpr std::size_t kComponents = 7;

enum class Format : std::uint8_t { text, json };

std::string_view to_string(Level l) noexcept;
std::string_view to_string(Component c) noexcept;
// "trace", "debug", "info", "warn" (or "warning"), "error", "off".
std::optional<Level> parse_level(std::string_view name) noexcept;
// "core", "net", "persist", "patterns", "cluster", "node", "app".
std::optional<Component> parse_component(std::string_view name) noexcept;

// One structured field of a line: a key and a text, integer, real or
// boolean value. Holds views (it owns nothing): build fields in the logging
// call itself. No thread safety of its own.
struct Field {
  enum class Kind : std::uint8_t { text, integer, unsigned_integer, real, boolean };

  Field(std::string_view k, std::string_view v) noexcept : key(k), kind(Kind::text), text(v) {}
  Field(std::string_view k, const std::string& v) noexcept : Field(k, std::string_view(v)) {}
  Field(std::string_view k, const char* v) noexcept : Field(k, std::string_view(v)) {}
  template <std::integral I>
  Field(std::string_view k, I v) noexcept : key(k) {
    if constexpr (std::same_as<I, bool>) {
      kind = Kind::boolean;
      boolean = v;
    } else if constexpr (std::signed_integral<I>) {
      kind = Kind::integer;
      integer = v;
    } else {
      kind = Kind::unsigned_integer;
      unsigned_integer = v;
    }
  }
  Field(std::string_view k, double v) noexcept : key(k), kind(Kind::real), real(v) {}

  std::string_view key;
  Kind kind = Kind::text;
  std::string_view text{};
  std::int64_t integer = 0;
  std::uint64_t unsigned_integer = 0;
  double real = 0;
  bool boolean = false;
};

// Where lines go and which are kept. A plain value (copies share nothing
// but the sink function); no thread safety of its own.
struct Config {
  Level level = Level::info;                            // every component's minimum level...
  std::vector<std::pair<Component, Level>> levels{};    // ...unless set here for it
  Format format = Format::text;
  // Appended to (created if missing); empty: stderr. Every line is flushed
  // as it is written, so a crash loses none.
  std::string file{};
  // Instead of stderr or the file, hands every formatted line (without its
  // newline) to this function, on the logging thread: for tests and for
  // applications with a logging system of their own. Must be thread-safe.
  std::function<void(std::string_view line)> sink{};
  // Added to every line, after its own fields (a node adds {"node", id}).
  std::vector<std::pair<std::string, std::string>> fields{};
};

// Applies `config` to every line written from now on. Errors:
// invalid_argument when the file cannot be opened (the previous settings
// stay).
Result<void> configure(const Config& config);
// The configuration in effect (the default one before any configure()).
Config current_config();

namespace detail {
extern std::array<std::atomic<std::uint8_t>, kComponents> g_min_level;
}  // namespace detail

// Whether a line of `level` from `component` would be written.
inline bool enabled(Component component, Level level) noexcept {
  return static_cast<std::uint8_t>(level) >=
         detail::g_min_level[static_cast<std::size_t>(component)].load(std::memory_order_relaxed);
}

// Formats and writes one line, whatever the level settings (check
// enabled() first, or use the functions below). Never throws: a line that
// cannot be written is dropped.
void write(Component component, Level level, std::string_view msg, std::initializer_list<Field> fields = {}) noexcept;

inline void trace(Component c, std::string_view msg, std::initializer_list<Field> f = {}) noexcept {
  if (enabled(c, Level::trace)) write(c, Level::trace, msg, f);
}
inline void debug(Component c, std::string_view msg, std::initializer_list<Field> f = {}) noexcept {
  if (enabled(c, Level::debug)) write(c, Level::debug, msg, f);
}
inline void info(Component c, std::string_view msg, std::initializer_list<Field> f = {}) noexcept {
  if (enabled(c, Level::info)) write(c, Level::info, msg, f);
}
inline void warn(Component c, std::string_view msg, std::initializer_list<Field> f = {}) noexcept {
  if (enabled(c, Level::warn)) write(c, Level::warn, msg, f);
}
inline void error(Component c, std::string_view msg, std::initializer_list<Field> f = {}) noexcept {
  if (enabled(c, Level::error)) write(c, Level::error, msg, f);
}

}  // namespace troupe::log

// Writes a line only if its level is enabled, and only then evaluates the
// message and fields: TROUPE_LOG(component, level, msg [, {fields}]).
#define TROUPE_LOG(component, level, ...)                                                  \
  do {                                                                                     \
    if (::troupe::log::enabled(component, level)) ::troupe::log::write(component, level, __VA_ARGS__); \
  } while (0)
