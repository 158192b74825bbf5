#pragma once
// This machine's host name (gethostname), "" if it cannot be read.
#include <unistd.h>

#include <string>

namespace tessera {

inline std::string hostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

}  // namespace tessera
