#pragma once
// Value types shared by every communicator backend.
#include <ATen/core/Tensor.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace tessera {

enum class ReduceOp { Sum, Avg, Max, Min };
enum class Backend { Gloo, Nccl };
// NCCL's CTA policy (ncclConfig_t::CTAPolicy, NCCL >= 2.27): Efficiency uses as few CTAs (SMs)
// as give decent bandwidth, for collectives that overlap compute; Zero none where it can.
enum class NcclCtaPolicy { Default, Efficiency, Zero };

const char* toString(ReduceOp op);
const char* toString(Backend b);
const char* toString(NcclCtaPolicy p);  // "default" | "efficiency" | "zero"
// "float32", "bfloat16", ... (what error messages print).
std::string dtypeName(c10::ScalarType t);
// fp32, bf16, fp16, int32, int64: the dtypes every collective supports.
bool isSupportedDtype(c10::ScalarType t);
// fp32, bf16, fp16: the floating dtypes among them (gradients, communication dtypes).
bool isFloatingDtype(c10::ScalarType t);

// Per-op timeout of a communicator unless its maker is given another (Settings::timeout).
constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(10);

// Who keeps an op's tensors alive until the device is done with them (see work.h).
// UntilDone (default): the communicator references them until it sees the op complete, so the
// caller may drop its references at once. ByCaller: the communicator references none of them;
// the caller keeps them until wait() returned (CPU) or, on CUDA, frees them only after a stream
// that waited on the op — stream-ordered, so the caching allocator can hand their memory to
// that stream's next allocation at once instead of when the op's completion is noticed on the
// host. Tensors allocated on another stream than the one that waits must not be ByCaller.
// Backends whose ops are not stream-ordered (Gloo) may keep them anyway.
enum class Keep { UntilDone, ByCaller };

// One point-to-point operation of a batched group (see Communicator::batchP2P).
struct P2POp {
  enum Kind { Send, Recv } kind;
  at::Tensor tensor;
  int peer;  // rank within the communicator
};

// What a collective call was: for error messages, the watchdog and debugging.
struct OpInfo {
  std::string op;       // "all_reduce", "all_gather", ...
  std::string group;    // communicator name, e.g. "world", "tp[0]"
  uint64_t seq = 0;     // per-communicator sequence number, starting at 1
  int rank = -1;        // rank within the group
  int groupSize = 0;
  std::string detail;   // "1024 x bfloat16, sum"
  Keep keep = Keep::UntilDone;
  // The call as a few integers (op, dtype, element count, reduction, root, seq) that the ranks of
  // the group compare before the op runs (TESSERA_DEBUG=fingerprint; comm/watchdog/fingerprint.h);
  // all zero: not compared (point-to-point ops, the check off or in detail mode).
  std::array<int64_t, 4> fingerprint{};
  std::string describe() const;  // "all_reduce #7 on group 'world' (rank 1 of 4, 1024 x bfloat16, sum)"
};

}  // namespace tessera
