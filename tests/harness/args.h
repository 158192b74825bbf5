#pragma once
// "key=value;key=value" → map: how tests pass several settings through RunOptions::arg.
#include <map>
#include <string>

namespace tessera::testing {

inline std::map<std::string, std::string> parseArgs(const std::string& s) {
  std::map<std::string, std::string> m;
  size_t p = 0;
  while (p < s.size()) {
    size_t e = s.find(';', p);
    auto kv = s.substr(p, e == std::string::npos ? std::string::npos : e - p);
    auto eq = kv.find('=');
    m[kv.substr(0, eq)] = kv.substr(eq + 1);
    p = e == std::string::npos ? s.size() : e + 1;
  }
  return m;
}

}  // namespace tessera::testing
