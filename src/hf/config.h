#pragma once
// A Hugging Face config.json (or any JSON object of settings) with typed getters whose errors
// name the file and the field: "tessera hf: 'ckpt/config.json': field 'hidden_size' is missing".
// Generic: what the fields mean for a model is the model mapping's business. Local.
//
// Internal to the build tree: it exposes nlohmann::json, which an installed tessera does not
// ship (src/CMakeLists.txt).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::hf {

class ConfigJson {
 public:
  // An empty object; `where` names it in messages.
  explicit ConfigJson(std::string where = "config.json");
  // `json` must be an object.
  ConfigJson(nlohmann::json json, std::string where);
  // Reads `path` (a file, or a directory holding config.json). Errors: no file, invalid JSON or
  // duplicate keys, not an object.
  static ConfigJson read(const std::string& path);
  // Writes it with 2-space indents, atomically (hf/json_io.h).
  void write(const std::string& path) const;

  const std::string& where() const { return where_; }
  const nlohmann::json& json() const { return json_; }
  nlohmann::json& json() { return json_; }

  // Present and not null.
  bool has(const std::string& key) const;
  // Getters: missing, null or of another type is an error; with a fallback, missing or null
  // gives the fallback (another type is still an error).
  int64_t getInt(const std::string& key) const;  // an integer in int64 (4096.0 is not)
  int64_t getInt(const std::string& key, int64_t fallback) const;
  double getDouble(const std::string& key) const;  // any number
  double getDouble(const std::string& key, double fallback) const;
  bool getBool(const std::string& key) const;
  bool getBool(const std::string& key, bool fallback) const;
  std::string getString(const std::string& key) const;
  std::string getString(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> getIntList(const std::string& key) const;  // an array of integers
  // A nested object ("rope_scaling"), named "<where>: rope_scaling" in its errors.
  ConfigJson getObject(const std::string& key) const;

  template <typename T>
  void set(const std::string& key, const T& value) {
    json_[key] = value;
  }

 private:
  const nlohmann::json& field(const std::string& key, const char* want) const;
  [[noreturn]] void wrongType(const std::string& key, const nlohmann::json& v, const char* want) const;
  nlohmann::json json_;
  std::string where_;
};

}  // namespace tessera::hf
