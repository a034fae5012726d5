#pragma once

// The dashboard's files (index.html, style.css, app.js and the modules it
// imports; embed.cmake lists them), compiled into
// troupe_node so that a node serves its dashboard with nothing installed
// beside the binary and nothing loaded from elsewhere. embed.cmake turns the
// files into byte arrays at build time and generates the definition of
// dashboard_asset(); doc/dashboard.md describes the page and the API it reads.

#include <optional>
#include <span>
#include <string_view>

namespace troupe::node::detail {

// One file of the dashboard. The views point into static storage and stay
// valid for the life of the program; the struct is immutable, so it may be
// shared between threads freely.
struct DashboardAsset {
  std::string_view path;          // the canonical path: "/", "/app.js", "/style.css", ...
  std::string_view content_type;  // ready for the Content-Type header
  std::string_view body;
};

// Every asset, index.html ("/") first. Thread-safe.
std::span<const DashboardAsset> dashboard_assets();

// The asset served at `path` ("/" → index.html, "/app.js", "/style.css",
// ...), or nullopt. `path` is the request target without its query string;
// "/index.html" is accepted as another name for "/". Thread-safe.
std::optional<DashboardAsset> dashboard_asset(std::string_view path);

}  // namespace troupe::node::detail
