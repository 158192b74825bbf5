#pragma once
// Reading environment variables with clear errors for malformed values.
#include <chrono>
#include <optional>
#include <string>

namespace tessera::env {

std::optional<std::string> get(const char* name);
// Integer value of `name`; throws tessera::Error naming the variable when it is not an integer.
std::optional<long long> getInt(const char* name);
// Duration in seconds (may be fractional) → milliseconds.
std::optional<std::chrono::milliseconds> getSeconds(const char* name);

}  // namespace tessera::env
