#pragma once
// Helpers of the src/hf suites: the value pattern tessera's tests and tests/hf/interop.py agree
// on, a byte-level safetensors writer independent of tessera's (for malformed files), the
// fixture (a fresh directory per test, tests/data/writers.h), a thrown error's message, a file's bytes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "data/writers.h"
#include "tessera/common/error.h"
#include "tessera/hf/safetensors.h"

namespace tessera::testing {

// Element i of tensor `name`: s = len(name) % 11, k = (7 i + s) % 11; floats (k - 5) / 2 (exact
// in F16 and BF16), signed integers k - 5, U8 k, BOOL k % 2. interop.py computes the same.
inline at::Tensor pattern(const std::string& name, at::ScalarType type, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const auto k = (at::arange(n, at::kLong) * 7 + static_cast<int64_t>(name.size() % 11)).remainder(11);
  at::Tensor v;
  if (at::isFloatingType(type)) {
    v = (k - 5).to(at::kDouble) / 2;
  } else if (type == at::kByte) {
    v = k;
  } else if (type == at::kBool) {
    v = k.remainder(2);
  } else {
    v = k - 5;
  }
  return v.to(type).reshape(shape);
}

// A file of the 8-byte length, `header` as given (no padding) and `data`.
inline std::string rawSafetensors(const std::string& header, const std::string& data) {
  std::string out;
  appendValue<uint64_t>(out, header.size());
  return out + header + data;
}

inline std::string zeros(size_t n) { return std::string(n, '\0'); }

using HfDir = DataDirTest;

// The message of the tessera::Error `f` throws (a test failure when it throws none).
inline std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

inline std::string readBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace tessera::testing
