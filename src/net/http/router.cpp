// The router: (method, path pattern) to handler, 404 and 405 otherwise.

#include <algorithm>
#include <stdexcept>

#include "syntax.hpp"
#include "troupe/net/http.hpp"

namespace troupe::http {

// --- router ------------------------------------------------------------------------

namespace {

struct Segment {
  bool param = false;
  std::string literal;  // when !param
};

// "/a/{x}/b" -> ["a", {}, "b"]; "/" -> [""].
std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> out;
  path.remove_prefix(1);
  for (;;) {
    const std::size_t slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) return out;
    path.remove_prefix(slash + 1);
  }
}

}  // namespace

// One path shape ("/a/{}/b") and the handlers of each method on it. The
// parameter names belong to each method's pattern, so "/a/{x}" for GET and
// "/a/{y}" for PUT share a shape.
struct Router::Route {
  struct Method {
    std::string method;
    std::vector<std::string> names;  // one per parameter segment, in order
    Handler handler;
  };
  std::vector<Segment> shape;
  std::vector<Method> methods;
};

struct Router::Match {
  const Route* route = nullptr;
};

Router& Router::add(std::string method, std::string pattern, Handler handler) {
  if (!detail::is_token(method))
    throw std::invalid_argument("router: method '" + method + "' is not a token");
  if (!handler) throw std::invalid_argument("router: no handler for " + method + " " + pattern);
  if (pattern.empty() || pattern.front() != '/')
    throw std::invalid_argument("router: pattern '" + pattern + "' does not start with '/'");
  std::vector<Segment> shape;
  std::vector<std::string> names;
  for (std::string_view seg : split_path(pattern)) {
    if (!seg.empty() && seg.front() == '{') {
      if (seg.size() < 3 || seg.back() != '}' ||
          seg.substr(1, seg.size() - 2).find_first_of("{}") != std::string_view::npos)
        throw std::invalid_argument("router: malformed parameter segment '" + std::string(seg) + "' in '" +
                                    pattern + "'");
      std::string name(seg.substr(1, seg.size() - 2));
      if (std::find(names.begin(), names.end(), name) != names.end())
        throw std::invalid_argument("router: parameter '" + name + "' repeated in '" + pattern + "'");
      names.push_back(std::move(name));
      shape.push_back(Segment{true, {}});
    } else {
      if (seg.find_first_of("{}") != std::string_view::npos)
        throw std::invalid_argument("router: a '{' or '}' inside segment '" + std::string(seg) + "' of '" +
                                    pattern + "'");
      std::string decoded;
      if (!detail::percent_decode(seg, decoded, false))
        throw std::invalid_argument("router: malformed percent-encoding in '" + pattern + "'");
      shape.push_back(Segment{false, std::move(decoded)});
    }
  }
  auto same_shape = [&](const Route& r) {
    if (r.shape.size() != shape.size()) return false;
    for (std::size_t i = 0; i < shape.size(); ++i)
      if (r.shape[i].param != shape[i].param || r.shape[i].literal != shape[i].literal) return false;
    return true;
  };
  auto it = std::find_if(routes_.begin(), routes_.end(), [&](const auto& r) { return same_shape(*r); });
  auto route = it == routes_.end() ? std::make_shared<Route>() : std::make_shared<Route>(**it);
  if (it == routes_.end()) route->shape = std::move(shape);
  for (const auto& m : route->methods)
    if (m.method == method) throw std::invalid_argument("router: " + method + " " + pattern + " added twice");
  route->methods.push_back(Route::Method{std::move(method), std::move(names), std::move(handler)});
  if (it == routes_.end())
    routes_.push_back(std::move(route));
  else
    *it = std::move(route);
  return *this;
}

// The route for a raw path, with its segments decoded into `segments`. When
// several shapes match, the one with a literal where the others first
// differ wins.
std::optional<Router::Match> Router::match(std::string_view raw_path, std::vector<std::string>& segments,
                                           bool& bad_escape) const {
  bad_escape = false;
  segments.clear();
  if (raw_path.empty() || raw_path.front() != '/') return std::nullopt;
  const std::vector<std::string_view> raw = split_path(raw_path);
  segments.resize(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (!detail::percent_decode(raw[i], segments[i], false)) {
      bad_escape = true;
      return std::nullopt;
    }
  }
  const Route* best = nullptr;
  for (const auto& r : routes_) {
    if (r->shape.size() != segments.size()) continue;
    bool ok = true;
    for (std::size_t i = 0; ok && i < segments.size(); ++i)
      ok = r->shape[i].param ? !segments[i].empty() : r->shape[i].literal == segments[i];
    if (!ok) continue;
    if (best) {
      for (std::size_t i = 0; i < segments.size(); ++i) {
        if (best->shape[i].param == r->shape[i].param) continue;
        if (!r->shape[i].param) best = r.get();
        break;
      }
    } else {
      best = r.get();
    }
  }
  if (!best) return std::nullopt;
  return Match{best};
}

std::vector<std::string> Router::allowed(std::string_view path) const {
  std::vector<std::string> segments;
  bool bad = false;
  const auto m = match(path, segments, bad);
  std::vector<std::string> out;
  if (!m) return out;
  bool get = false;
  bool head = false;
  for (const auto& meth : m->route->methods) {
    out.push_back(meth.method);
    get = get || meth.method == "GET";
    head = head || meth.method == "HEAD";
  }
  if (get && !head) out.emplace_back("HEAD");
  return out;
}

Router& Router::guard(Guard check) {
  guard_ = std::move(check);
  return *this;
}

void Router::dispatch(Request& request, Responder responder) const {
  if (guard_) {
    if (auto refused = guard_(request)) {
      responder.respond(std::move(*refused));
      return;
    }
  }
  const std::optional<std::string_view> raw = detail::target_path(request.target);
  const std::string_view raw_path = raw ? *raw : std::string_view(request.path);
  std::vector<std::string> segments;
  bool bad_escape = false;
  const auto m = match(raw_path, segments, bad_escape);
  if (bad_escape) {
    responder.respond(Response::error(400, "bad_request", "malformed percent-encoding in the path"));
    return;
  }
  if (!m) {
    responder.respond(
        Response::error(404, "not_found", "no route for " + request.method + " " + request.path));
    return;
  }
  const Route::Method* found = nullptr;
  for (const auto& meth : m->route->methods)
    if (meth.method == request.method) found = &meth;
  if (!found && request.method == "HEAD") {
    for (const auto& meth : m->route->methods)
      if (meth.method == "GET") found = &meth;
  }
  if (!found) {
    std::string allow;
    for (const std::string& a : allowed(raw_path)) {
      if (!allow.empty()) allow += ", ";
      allow += a;
    }
    Response r =
        Response::error(405, "method_not_allowed",
                        request.method + " is not allowed on " + request.path + " (allowed: " + allow + ")");
    r.headers.emplace_back("Allow", std::move(allow));
    responder.respond(std::move(r));
    return;
  }
  std::size_t p = 0;
  for (std::size_t i = 0; i < segments.size(); ++i)
    if (m->route->shape[i].param) request.params[found->names[p++]] = std::move(segments[i]);
  found->handler(request, std::move(responder));
}

}  // namespace troupe::http
