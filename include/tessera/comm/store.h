#pragma once
// Rendezvous store: LibTorch's c10d::TCPStore (its wire protocol is unversioned, so tessera
// links LibTorch's own rather than speaking it itself) and c10d::PrefixStore.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace tessera {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

// Starts a TCPStore server in this process, listening on `port` (0 → an ephemeral port;
// read it back with storePort()). Local; the server lives as long as a store using it.
// Multi-tenant (c10d's TCPStoreOptions::multiTenant): when this process already runs a
// multi-tenant server on `port` — torch.distributed's env:// and tcp:// rendezvous create theirs
// so, and they link this very LibTorch — that server is shared instead of binding the port a
// second time; torch.distributed initialised after tessera shares tessera's the same way.
StorePtr startStoreServer(uint16_t port, std::chrono::milliseconds timeout);
// Connects a client to host:port, retrying until `timeout`; throws naming the address.
StorePtr connectStore(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);
// The port a store made by startStoreServer/connectStore talks to.
uint16_t storePort(const StorePtr& store);
// Keys of the returned store are `prefix + "/" + key` in `store`.
StorePtr prefixStore(const std::string& prefix, StorePtr store);

}  // namespace tessera
