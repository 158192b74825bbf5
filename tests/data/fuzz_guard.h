#pragma once
// Shared by the libFuzzer targets that tests/data/run_fuzz.sh builds (fuzz_formats.cpp,
// tests/hf/fuzz_safetensors.cpp): running a parser on fuzzed bytes, where a tessera::Error that
// names the file is the expected answer and anything else a finding (printed, then abort()).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "tessera/common/error.h"

namespace tessera::fuzz {

// Runs `f` (the parser `parser` of target `target` on `file`'s bytes).
template <typename F>
void guarded(const char* target, const char* parser, const std::string& file, F&& f) {
  try {
    f();
  } catch (const tessera::Error& e) {
    if (std::string(e.what()).find(file) == std::string::npos) {
      std::fprintf(stderr, "\n*** tessera %s: %s threw a tessera::Error that does not name '%s': %s\n", target,
                   parser, file.c_str(), e.what());
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\n*** tessera %s: %s threw a non-tessera exception: %s\n", target, parser, e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "\n*** tessera %s: %s threw an unknown exception\n", target, parser);
    std::abort();
  }
}

}  // namespace tessera::fuzz
