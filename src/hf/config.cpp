#include "hf/config.h"

#include <cstdlib>
#include <filesystem>

#include "tessera/common/error.h"
#include "hf/json_io.h"

namespace tessera::hf {

ConfigJson::ConfigJson(std::string where) : json_(nlohmann::json::object()), where_(std::move(where)) {}

ConfigJson::ConfigJson(nlohmann::json json, std::string where) : json_(std::move(json)), where_(std::move(where)) {
  TESSERA_CHECK(json_.is_object(), "tessera hf: '{}' is JSON {}, not an object", where_, json_.type_name());
}

ConfigJson ConfigJson::read(const std::string& path) {
  const auto file = std::filesystem::is_directory(path) ? (std::filesystem::path(path) / "config.json").string() : path;
  return ConfigJson(readJsonFile(file), file);
}

void ConfigJson::write(const std::string& path) const { writeJsonFile(path, json_); }

bool ConfigJson::has(const std::string& key) const {
  const auto it = json_.find(key);
  return it != json_.end() && !it->is_null();
}

void ConfigJson::wrongType(const std::string& key, const nlohmann::json& v, const char* want) const {
  const std::string shown = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  TESSERA_CHECK(false, "tessera hf: '{}': field '{}' is {} ({}), not {}", where_, key,
                shown.size() > 60 ? shown.substr(0, 57) + "..." : shown, v.type_name(), want);
  std::abort();  // unreachable
}

const nlohmann::json& ConfigJson::field(const std::string& key, const char* want) const {
  const auto it = json_.find(key);
  TESSERA_CHECK(it != json_.end(), "tessera hf: '{}': field '{}' is missing (expected {})", where_, key, want);
  TESSERA_CHECK(!it->is_null(), "tessera hf: '{}': field '{}' is null (expected {})", where_, key, want);
  return *it;
}

int64_t ConfigJson::getInt(const std::string& key) const {
  constexpr const char* want = "an integer";
  const auto& v = field(key, want);
  if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    return v.get<int64_t>();
  }
  wrongType(key, v, want);
}

int64_t ConfigJson::getInt(const std::string& key, int64_t fallback) const {
  return has(key) ? getInt(key) : fallback;
}

double ConfigJson::getDouble(const std::string& key) const {
  const auto& v = field(key, "a number");
  if (!v.is_number()) wrongType(key, v, "a number");
  return v.get<double>();
}

double ConfigJson::getDouble(const std::string& key, double fallback) const {
  return has(key) ? getDouble(key) : fallback;
}

bool ConfigJson::getBool(const std::string& key) const {
  const auto& v = field(key, "true or false");
  if (!v.is_boolean()) wrongType(key, v, "true or false");
  return v.get<bool>();
}

bool ConfigJson::getBool(const std::string& key, bool fallback) const { return has(key) ? getBool(key) : fallback; }

std::string ConfigJson::getString(const std::string& key) const {
  const auto& v = field(key, "a string");
  if (!v.is_string()) wrongType(key, v, "a string");
  return v.get<std::string>();
}

std::string ConfigJson::getString(const std::string& key, const std::string& fallback) const {
  return has(key) ? getString(key) : fallback;
}

std::vector<int64_t> ConfigJson::getIntList(const std::string& key) const {
  constexpr const char* want = "an array of integers";
  const auto& v = field(key, want);
  if (!v.is_array()) wrongType(key, v, want);
  std::vector<int64_t> out;
  for (const auto& x : v) {
    if (!x.is_number_integer() || (x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      wrongType(key, v, want);
    }
    out.push_back(x.get<int64_t>());
  }
  return out;
}

ConfigJson ConfigJson::getObject(const std::string& key) const {
  const auto& v = field(key, "an object");
  if (!v.is_object()) wrongType(key, v, "an object");
  return ConfigJson(v, where_ + ": " + key);
}

}  // namespace tessera::hf
