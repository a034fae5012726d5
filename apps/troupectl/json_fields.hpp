#pragma once
// Reading the admin API's JSON defensively, for troupectl's commands and
// views: a field that is absent, null or of another type reads as null, an
// empty array, or "—" in a table cell, never as an exception. Defined in
// views.cpp.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace troupe::ctl::detail {

// One JSON value as a table cell: "—" for null or an empty string.
std::string cell(const nlohmann::json& v);
// obj[key], or null when `obj` is not an object or has no such key.
const nlohmann::json& field(const nlohmann::json& obj, const char* key);
// cell(field(obj, key)).
std::string cell(const nlohmann::json& obj, const char* key);
// A number field as an integer (a float is truncated); nullopt otherwise.
std::optional<std::int64_t> int_field(const nlohmann::json& obj, const char* key);
// An array field, or an empty array.
const nlohmann::json& array_field(const nlohmann::json& obj, const char* key);

}  // namespace troupe::ctl::detail
