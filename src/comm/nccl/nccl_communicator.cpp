#include "comm/nccl/nccl_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "tessera/comm/backends.h"
#include "comm/nccl/cuda_glue.h"
#include "comm/nccl/nccl_check.h"
#include "comm/nccl/nccl_state.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

namespace tessera {

using nccl_detail::DeviceGuard;
using nccl_detail::NcclState;

namespace {

// Store key of the n-th communicator called `name` made by this process (ranks make their
// communicators in the same order, so n agrees across ranks).
std::string uniqueIdKey(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, int> made;
  std::lock_guard<std::mutex> l(mu);
  return fmt::format("nccl/{}/{}/unique_id", name, made[name]++);
}

// Each tessera communicator holds two NCCL communicators over the same ranks:
// - control: non-blocking, made first. Its init (or split) is polled and bounded by the
//   timeout, and aborted when it expires: it proves every peer is there.
// - data: blocking, made right after from peers that just proved alive; every op runs on
//   it. A non-blocking communicator hands each op to a new NCCL thread (measured on
//   nvidia-h200-x2: 0.23-0.36 of PyTorch's busbw at 1 MiB, against 1.4-1.9 blocking).
// setNcclOptions(false, ...) (TESSERA_NCCL_BLOCKING=0) runs the ops on the non-blocking
// communicator itself (one comm).
std::atomic<bool> g_blockingOps{true};
// NCCL's CTA policy for every communicator made afterwards (setNcclOptions); -1: NCCL's own.
std::atomic<int> g_ctaPolicy{-1};
// Streams of communicators made afterwards: the device's greatest priority, else the default.
std::atomic<bool> g_highPriorityStreams{true};

bool blockingOps() { return g_blockingOps.load(); }

ncclConfig_t commConfig(bool blocking) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking ? 1 : 0;
#ifdef NCCL_CTA_POLICY_EFFICIENCY
  if (const int p = g_ctaPolicy.load(); p >= 0) cfg.CTAPolicy = p;
#endif
  return cfg;
}

}  // namespace

void setNcclOptions(bool blocking, NcclCtaPolicy policy, bool highPriorityStreams) {
  int p = -1;
  if (policy != NcclCtaPolicy::Default) {
#ifdef NCCL_CTA_POLICY_EFFICIENCY
    p = policy == NcclCtaPolicy::Efficiency ? NCCL_CTA_POLICY_EFFICIENCY : NCCL_CTA_POLICY_ZERO;
#else
    throw Error(fmt::format("tessera: NCCL CTA policy '{}' (TESSERA_NCCL_CTA_POLICY): this NCCL ({}) has no CTA "
                            "policies (NCCL >= 2.27)",
                            toString(policy), NCCL_VERSION_CODE));
#endif
  }
  g_blockingOps = blocking;
  g_ctaPolicy = p;
  g_highPriorityStreams = highPriorityStreams;
}

NcclCommunicator::NcclCommunicator(const StorePtr& store, int rank, int size, int device, const std::string& name,
                                   std::chrono::milliseconds timeout)
    : Communicator(rank, size, name), device_(device) {
  setTimeout(timeout);
  setSideChannel(store, "nccl/" + name);
  int devices = cudaDeviceCount();
  TESSERA_CHECK(device >= 0 && device < devices,
                "tessera: NCCL communicator '{}' (rank {} of {}): device index {} is not one of the {} visible CUDA "
                "devices",
                name, rank, size, device, devices);
  st_ = std::make_shared<NcclState>(rank, size, device, name);
  DeviceGuard g(device);
  auto t0 = nccl_detail::Clock::now();
  ncclUniqueId id[2];  // control, data
  std::string key = uniqueIdKey(name);
  if (rank == 0) {
    TESSERA_NCCL_CHECK(ncclGetUniqueId(&id[0]), rank, nullptr);
    TESSERA_NCCL_CHECK(ncclGetUniqueId(&id[1]), rank, nullptr);
    const auto* p = reinterpret_cast<const uint8_t*>(id);
    store->set(key, std::vector<uint8_t>(p, p + sizeof(id)));
  } else {
    std::vector<uint8_t> v;
    try {
      store->wait({key}, timeout);
      v = store->get(key);
    } catch (const std::exception& e) {
      throw CommError(fmt::format("tessera: NCCL communicator '{}' (rank {} of {}): rank 0's ncclUniqueId did not "
                                  "arrive in the store under '{}' after {:.1f} s: {}",
                                  name, rank, size, key, nccl_detail::secondsSince(t0), e.what()));
    }
    TESSERA_CHECK(v.size() == sizeof(id), "tessera: NCCL communicator '{}' (rank {}): store key '{}' holds {} bytes, "
                  "an ncclUniqueId has {}", name, rank, key, v.size(), sizeof(id));
    std::memcpy(&id, v.data(), sizeof(id));
  }
  ncclComm_t c = nullptr, d = nullptr;
  try {
    ncclConfig_t cfg = commConfig(false);
    TESSERA_NCCL_CHECK(ncclCommInitRankConfig(&c, size, id[0], rank, &cfg), rank, c);
    st_->waitNotInProgress(c, "ncclCommInitRankConfig", timeout);
    if (blockingOps()) {
      ncclConfig_t dcfg = commConfig(true);
      TESSERA_NCCL_CHECK(ncclCommInitRankConfig(&d, size, id[1], rank, &dcfg), rank, d);
    }
  } catch (const std::exception& e) {
    if (d) ncclCommAbort(d);
    if (c) ncclCommAbort(c);
    throw CommError(fmt::format("tessera: NCCL communicator '{}' (rank {} of {}, cuda:{}) could not be created: {}",
                                name, rank, size, device, e.what()));
  }
  st_->control = d ? c : nullptr;
  st_->comm = d ? d : c;
  st_->start(g_highPriorityStreams.load());
  log::debug("nccl communicator '{}' rank {} of {} on cuda:{} ready in {:.2f} s", name, rank, size, device,
             nccl_detail::secondsSince(t0));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclState> state, std::chrono::milliseconds timeout)
    : Communicator(state->rank, state->size, state->name), st_(std::move(state)), device_(st_->device) {
  setTimeout(timeout);
}

NcclCommunicator::~NcclCommunicator() {
  try {
    st_->shutdown();
  } catch (const std::exception& e) {
    log::warn("NCCL communicator '{}' shutdown: {}", name_, e.what());
  }
}

void NcclCommunicator::abort(const std::string& reason) {
  st_->fail(fmt::format("tessera: NCCL communicator '{}' (rank {} of {}) aborted: {}", name_, rank_, size_, reason));
}

void NcclCommunicator::checkDevice(const OpInfo& i, const char* what, const at::Tensor& t) const {
  TESSERA_CHECK(t.device().is_cuda() && t.device().index() == device_,
                "{}: {} tensor is on {}; NCCL communicator '{}' (rank {}) takes tensors on cuda:{}", i.describe(),
                what, t.device().str(), name_, rank_, device_);
}

at::TensorOptions NcclCommunicator::scratchOptions() const {
  return at::TensorOptions().device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_)));
}

#define NCHECK(call) TESSERA_NCCL_CHECK(call, rank_, c)

std::shared_ptr<Communicator> NcclCommunicator::doSplit(int color, const std::vector<int>& members,
                                                        const std::string& name, const std::string& tag) {
  // ncclCommSplit is collective over this communicator: ranks outside every new group must
  // call it too (members empty → NCCL_SPLIT_NOCOLOR); key = index in `members`.
  int newRank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  TESSERA_CHECK(members.empty() || newRank < static_cast<int>(members.size()),
                "tessera: split of NCCL communicator '{}' into '{}': rank {} is not among its members", name_, name,
                rank_);
  auto st = std::make_shared<NcclState>(newRank, static_cast<int>(members.size()), device_, name);
  ncclComm_t nc = nullptr, nd = nullptr;
  {
    std::unique_lock<std::timed_mutex> lock(st_->opMu);
    auto broken = st_->broken();
    if (!broken.empty()) {
      throw CommError(fmt::format("tessera: split of NCCL communicator '{}' into '{}' not run: it is broken: {}",
                                  name_, name, broken));
    }
    DeviceGuard g(device_);
    // Control first (non-blocking, bounded), then data (blocking) from the data parent.
    ncclComm_t c = st_->control ? st_->control : st_->comm;
    int splitColor = members.empty() ? NCCL_SPLIT_NOCOLOR : color;
    try {
      ncclConfig_t cfg = commConfig(false);
      NCHECK(ncclCommSplit(c, splitColor, newRank, &nc, &cfg));
      st_->waitNotInProgress(nc ? nc : c, fmt::format("ncclCommSplit ({}, color {})", tag, color), timeout_);
      if (st_->control) {
        ncclConfig_t dcfg = commConfig(true);
        NCHECK(ncclCommSplit(st_->comm, splitColor, newRank, &nd, &dcfg));
      }
    } catch (const std::exception& e) {
      if (nd) ncclCommAbort(nd);
      if (nc) ncclCommAbort(nc);
      lock.unlock();
      auto msg = fmt::format("tessera: split of NCCL communicator '{}' (rank {} of {}) into '{}' failed: {}", name_,
                             rank_, size_, name, e.what());
      st_->fail(msg);
      throw CommError(msg);
    }
  }
  if (members.empty() || !nc) return nullptr;
  st->control = nd ? nc : nullptr;
  st->comm = nd ? nd : nc;
  st->start(g_highPriorityStreams.load());
  return std::make_shared<NcclCommunicator>(st, timeout_);
}

#undef NCHECK

}  // namespace tessera
