#include "common/env.h"

#include <cstdlib>

#include "tessera/common/error.h"

namespace tessera::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::optional<long long> getInt(const char* name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  TESSERA_CHECK(end && *end == '\0', "environment variable {}='{}' is not an integer", name, *v);
  return x;
}

std::optional<std::chrono::milliseconds> getSeconds(const char* name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  double s = std::strtod(v->c_str(), &end);
  TESSERA_CHECK(end && *end == '\0' && s > 0, "environment variable {}='{}' is not a positive number of seconds",
                name, *v);
  return std::chrono::milliseconds(static_cast<long long>(s * 1000.0));
}

}  // namespace tessera::env
