// The logging facade (troupe/core/log.hpp): formats each line (text or one
// JSON object) with the current trace id, and hands it to spdlog, which
// writes it to stderr or a file, or to the configured sink function.

#include "troupe/core/log.hpp"

#include <spdlog/logger.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <mutex>

#include "troupe/core/trace.hpp"

namespace troupe::log {

namespace detail {
std::array<std::atomic<std::uint8_t>, kComponents> g_min_level{
    {{2}, {2}, {2}, {2}, {2}, {2}, {2}}};  // Level::info
static_assert(static_cast<int>(Level::info) == 2);
}  // namespace detail

namespace {


// What configure() set up, shared by the lines being written with it.
struct Backend {
  Format format = Format::text;
  std::shared_ptr<spdlog::logger> logger;     // stderr or the file, unless `sink`
  std::function<void(std::string_view)> sink;
  std::string extra_text;                     // Config::fields, rendered once
  std::string extra_json;
};

std::mutex g_mu;
std::shared_ptr<const Backend> g_backend;  // under g_mu; built on first use
Config g_config;                           // under g_mu

std::shared_ptr<spdlog::logger> make_logger(std::shared_ptr<spdlog::sinks::sink> sink) {
  auto l = std::make_shared<spdlog::logger>("troupe", std::move(sink));
  l->set_pattern("%v");  // the line is formatted here, whole
  l->set_level(spdlog::level::trace);
  l->flush_on(spdlog::level::trace);
  return l;
}

spdlog::level::level_enum spd_level(Level l) {
  switch (l) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: break;
  }
  return spdlog::level::off;
}

void json_escape(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
}

// Text values with a space, quote, '=' or control character are quoted.
void text_value(std::string& out, std::string_view s) {
  bool plain = !s.empty();
  for (char ch : s)
    if (static_cast<unsigned char>(ch) <= ' ' || ch == '"' || ch == '=') plain = false;
  if (plain) {
    out += s;
    return;
  }
  out += '"';
  json_escape(out, s);
  out += '"';
}

// Keys that every JSON line has already: a field under one of these names
// is written with a leading underscore instead.
bool reserved(std::string_view k) {
  return k == "ts" || k == "level" || k == "component" || k == "msg" || k == "trace_id";
}

void field_value(std::string& out, const Field& f, bool json) {
  switch (f.kind) {
    case Field::Kind::text:
      if (json) {
        out += '"';
        json_escape(out, f.text);
        out += '"';
      } else {
        text_value(out, f.text);
      }
      return;
    case Field::Kind::integer: out += std::to_string(f.integer); return;
    case Field::Kind::unsigned_integer: out += std::to_string(f.unsigned_integer); return;
    case Field::Kind::real: {
      char b[32];
      int n = std::snprintf(b, sizeof b, "%.17g", f.real);
      // JSON has no NaN or infinity.
      if (json && (f.real != f.real || f.real - f.real != 0)) {
        out += "null";
      } else {
        out.append(b, static_cast<std::size_t>(n));
      }
      return;
    }
    case Field::Kind::boolean: out += f.boolean ? "true" : "false"; return;
  }
}

void timestamp(std::string& out) {
  auto now = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char b[32];
  int n = std::snprintf(b, sizeof b, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                        tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  out.append(b, static_cast<std::size_t>(n));
}

void render_extra(Backend& b, const std::vector<std::pair<std::string, std::string>>& fields) {
  for (const auto& [k, v] : fields) {
    Field f(k, v);
    b.extra_text += ' ';
    b.extra_text += k;
    b.extra_text += '=';
    field_value(b.extra_text, f, false);
    b.extra_json += ",\"";
    if (reserved(k)) b.extra_json += '_';
    json_escape(b.extra_json, k);
    b.extra_json += "\":";
    field_value(b.extra_json, f, true);
  }
}

std::shared_ptr<const Backend> backend() {
  std::lock_guard lk(g_mu);
  if (!g_backend) {
    auto b = std::make_shared<Backend>();
    b->logger = make_logger(std::make_shared<spdlog::sinks::stderr_sink_mt>());
    g_backend = std::move(b);
  }
  return g_backend;
}

void format_text(std::string& line, Component c, Level l, std::string_view msg,
                 std::initializer_list<Field> fields, const Backend& b) {
  timestamp(line);
  line += ' ';
  auto name = to_string(l);
  line += name;
  line.append(6 - name.size(), ' ');
  line += to_string(c);
  if (const TraceContext* t = current_trace()) {
    line += " [";
    std::size_t at = line.size();
    line.resize(at + 32);
    t->trace_id.to_hex(line.data() + at);
    line += ']';
  }
  line += ' ';
  line += msg;
  for (const Field& f : fields) {
    line += ' ';
    line += f.key;
    line += '=';
    field_value(line, f, false);
  }
  line += b.extra_text;
}

void format_json(std::string& line, Component c, Level l, std::string_view msg,
                 std::initializer_list<Field> fields, const Backend& b) {
  line += "{\"ts\":\"";
  timestamp(line);
  line += "\",\"level\":\"";
  line += to_string(l);
  line += "\",\"component\":\"";
  line += to_string(c);
  line += "\",\"msg\":\"";
  json_escape(line, msg);
  line += '"';
  if (const TraceContext* t = current_trace()) {
    line += ",\"trace_id\":\"";
    std::size_t at = line.size();
    line.resize(at + 32);
    t->trace_id.to_hex(line.data() + at);
    line += '"';
  }
  for (const Field& f : fields) {
    line += ",\"";
    if (reserved(f.key)) line += '_';
    json_escape(line, f.key);
    line += "\":";
    field_value(line, f, true);
  }
  line += b.extra_json;
  line += '}';
}

}  // namespace

Result<void> configure(const Config& config) {
  auto b = std::make_shared<Backend>();
  b->format = config.format;
  b->sink = config.sink;
  if (!b->sink) {
    try {
      std::shared_ptr<spdlog::sinks::sink> sink;
      if (config.file.empty()) {
        sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
      } else {
        sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(config.file, false);
      }
      b->logger = make_logger(std::move(sink));
    } catch (const std::exception& e) {
      return Error(ErrorCode::invalid_argument, "log file '" + config.file + "': " + e.what());
    }
  }
  render_extra(*b, config.fields);
  std::array<Level, kComponents> levels;
  levels.fill(config.level);
  for (const auto& [c, l] : config.levels) levels[static_cast<std::size_t>(c)] = l;
  std::lock_guard lk(g_mu);
  g_backend = std::move(b);
  g_config = config;
  for (std::size_t i = 0; i < kComponents; ++i)
    detail::g_min_level[i].store(static_cast<std::uint8_t>(levels[i]), std::memory_order_relaxed);
  return {};
}

Config current_config() {
  std::lock_guard lk(g_mu);
  return g_config;
}

void write(Component component, Level level, std::string_view msg, std::initializer_list<Field> fields) noexcept {
  if (level == Level::off) return;
  try {
    auto b = backend();
    std::string line;
    line.reserve(128 + msg.size());
    if (b->format == Format::json) {
      format_json(line, component, level, msg, fields, *b);
    } else {
      format_text(line, component, level, msg, fields, *b);
    }
    if (b->sink) {
      b->sink(line);
    } else {
      b->logger->log(spd_level(level), spdlog::string_view_t(line.data(), line.size()));
    }
  } catch (...) {
    // a line that cannot be written is dropped: logging never fails its caller
  }
}

}  // namespace troupe::log
