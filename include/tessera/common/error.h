#pragma once
// tessera's error type and check macro. Every failure surfaces as tessera::Error (a
// std::runtime_error, so pybind11 turns it into a Python RuntimeError with the same text).
// Messages name what failed: the op, the rank, the group and the offending value.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A communication failure: a peer died, an op timed out, a communicator was aborted.
class CommError : public Error {
 public:
  explicit CommError(const std::string& what) : Error(what) {}
};

}  // namespace tessera

// TESSERA_CHECK(cond, "fmt {}", args...): throws tessera::Error with the formatted message.
#define TESSERA_CHECK(cond, ...)                                      \
  do {                                                                \
    if (!(cond)) throw ::tessera::Error(fmt::format(__VA_ARGS__));    \
  } while (0)
