#include "tessera/comm/store.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/compat.h"
#include "tessera/common/error.h"

namespace tessera {

StorePtr startStoreServer(uint16_t port, std::chrono::milliseconds timeout) {
  auto o = compat::tcpStoreOptions(port, true, timeout);
  o.multiTenant = true;  // share a server this process already runs on `port` (store.h)
  try {
    return c10::make_intrusive<c10d::TCPStore>("0.0.0.0", o);
  } catch (const std::exception& e) {
    throw Error(fmt::format("tessera: could not start the rendezvous store server on port {} (another process, or a "
                            "server in this process that is not multi-tenant, may hold the port): {}",
                            port, e.what()));
  }
}

StorePtr connectStore(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, compat::tcpStoreOptions(port, false, timeout));
  } catch (const std::exception& e) {
    throw Error(fmt::format("tessera: could not connect to the rendezvous store at {}:{} within {} s: {}", host, port,
                            timeout.count() / 1000.0, e.what()));
  }
}

uint16_t storePort(const StorePtr& store) {
  auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get());
  TESSERA_CHECK(tcp, "tessera: storePort() needs a TCPStore");
  return tcp->getPort();
}

StorePtr prefixStore(const std::string& prefix, StorePtr store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
}

}  // namespace tessera
