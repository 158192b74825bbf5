#pragma once
// The one place where LibTorch 1.13 (Debian, CPU) and 2.x (PyTorch wheels, CUDA) differ for
// tessera. Keep version conditionals here.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>

namespace tessera::compat {

inline c10d::TCPStoreOptions tcpStoreOptions(uint16_t port, bool isServer, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = isServer;
  o.numWorkers = c10::nullopt;
  o.waitWorkers = false;
  o.timeout = timeout;
  return o;
}

}  // namespace tessera::compat
