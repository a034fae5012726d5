// The node's [log] table: levels (one for all, and per component under
// [log.levels]), format and file, for troupe::log::configure.

#include "config_workers.hpp"

namespace troupe::node::detail {

namespace {

Error bad(std::string what) { return Error(ErrorCode::invalid_argument, std::move(what)); }

Result<log::Level> level_of(ConfigReader& r, std::string_view key, const std::string& setting) {
  auto v = r.string(key, "info");
  if (!v.ok()) return std::move(v).error();
  auto l = log::parse_level(*v);
  if (!l) return bad(setting + ": expected trace, debug, info, warn, error or off, got \"" + *v + "\"");
  return *l;
}

}  // namespace

Result<LogConfig> parse_log(const toml::node* n) {
  LogConfig c;
  if (!n) return c;
  if (!n->is_table()) return bad("log: expected a table ([log])");
  toml::table own = *n->as_table();
  // [log.levels] is read here; the rest of [log] by its reader.
  if (const toml::node* lv = own.get("levels")) {
    if (!lv->is_table()) return bad("log.levels: expected a table ([log.levels])");
    const toml::table& t = *lv->as_table();
    ConfigReader r(&t, "log.levels");
    for (const auto& [k, v] : t) {
      std::string name(k.str());
      auto comp = log::parse_component(name);
      if (!comp)
        return bad("log.levels." + name + ": unknown component (core, net, persist, patterns, cluster, node, app)");
      auto l = level_of(r, name, "log.levels." + name);
      if (!l.ok()) return std::move(l).error();
      c.levels.emplace_back(*comp, *l);
    }
    own.erase("levels");
  }
  ConfigReader r(&own, "log");
  auto level = level_of(r, "level", "log.level");
  if (!level.ok()) return std::move(level).error();
  c.level = *level;
  auto format = r.choice("format", "text", {"text", "json"});
  if (!format.ok()) return std::move(format).error();
  c.format = *format == "json" ? log::Format::json : log::Format::text;
  auto file = r.string("file", "");
  if (!file.ok()) return std::move(file).error();
  c.file = *file;
  if (auto f = r.finish(); !f.ok()) return std::move(f).error();
  return c;
}

}  // namespace troupe::node::detail
