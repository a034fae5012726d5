// HTTP syntax helpers; see syntax.hpp.

#include "syntax.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>

namespace troupe::http::detail {

namespace {

char lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool is_tchar(unsigned char c) noexcept {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool is_ows(char c) noexcept { return c == ' ' || c == '\t'; }

std::string_view trim_ows(std::string_view s) noexcept {
  while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

bool is_token(std::string_view s) noexcept {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); });
}

std::string_view find_field(const Fields& fields, std::string_view name) noexcept {
  for (const auto& [n, v] : fields)
    if (iequals(n, name)) return v;
  return {};
}

bool field_ok(std::string_view name, std::string_view value) noexcept {
  return is_token(name) && value.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

bool has_token(std::string_view list, std::string_view token) noexcept {
  for (;;) {
    const std::size_t comma = list.find(',');
    if (iequals(trim_ows(list.substr(0, comma)), token)) return true;
    if (comma == std::string_view::npos) return false;
    list.remove_prefix(comma + 1);
  }
}

std::vector<std::string_view> split_list(std::string_view list) {
  std::vector<std::string_view> out;
  for (;;) {
    const std::size_t comma = list.find(',');
    if (const std::string_view item = trim_ows(list.substr(0, comma)); !item.empty()) out.push_back(item);
    if (comma == std::string_view::npos) return out;
    list.remove_prefix(comma + 1);
  }
}

bool percent_decode(std::string_view in, std::string& out, bool plus_is_space, bool allow_nul) {
  out.clear();
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      if (in.size() - i < 3) return false;
      const int hi = hex_value(in[i + 1]);
      const int lo = hex_value(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      const int v = hi * 16 + lo;
      if (v == 0 && !allow_nul) return false;
      out.push_back(static_cast<char>(v));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return true;
}

std::optional<std::string_view> target_path(std::string_view target) noexcept {
  if (!target.empty() && target.front() == '/') return target.substr(0, target.find('?'));
  std::size_t authority = 0;
  if (target.size() >= 7 && iequals(target.substr(0, 7), "http://"))
    authority = 7;
  else if (target.size() >= 8 && iequals(target.substr(0, 8), "https://"))
    authority = 8;
  if (authority == 0) return std::nullopt;
  const std::size_t end = target.find_first_of("/?", authority);
  if (end == authority || authority == target.size()) return std::nullopt;  // no host
  if (end == std::string_view::npos || target[end] == '?') return std::string_view("/");
  return target.substr(end, target.find('?', end) - end);
}

std::string millis(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

std::string http_date(std::int64_t unix_seconds) {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday % 7], tm.tm_mday,
                kMonths[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
  return buf;
}

}  // namespace troupe::http::detail
