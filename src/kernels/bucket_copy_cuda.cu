// The multi-tensor copy kernel behind flattenScaleCast / unflattenCast (see bucket_copy.h).
// One launch moves up to kMaxItemsPerLaunch tensors: every tensor is cut into chunks of
// kChunk elements, and blocks walk the flattened (tensor, chunk) index grid-stride. Inside a
// chunk, threads use 16-byte vector accesses (for the wider of the two element types) when
// source and destination reach vector alignment at the same element; otherwise, and for the
// unaligned head and tail, they copy element by element. Math is fp32; stores round to nearest
// even (the same rounding as ATen's CPU casts, so results match the CPU reference).
#include <cstdint>
#include <string>

#include "kernels/bucket_copy_cuda.h"
#include "kernels/cuda_common.cuh"

namespace tessera::kernels::detail {
namespace {

constexpr int kThreads = 256;
constexpr long long kChunk = 8192;  // elements per (tensor, chunk) work item
constexpr int kBlocksPerSm = 8;     // grid cap: about one resident wave of 256-thread blocks

struct Entry {
  const void* src;
  void* dst;
  long long numel;
  long long firstChunk;  // index of this tensor's first chunk in the launch
  int srcType;
  int dstType;
};

// Passed by value as the kernel parameter (48 entries * 40 bytes, well under the 4 KiB limit).
struct Batch {
  Entry e[kMaxItemsPerLaunch];
  int count;
  long long totalChunks;
  float scale;
  bool applyScale;
};

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename S, typename D>
__device__ __forceinline__ D convert(S x, float scale, bool applyScale) {
  float f = toFloat<S>(x);
  if (applyScale) f *= scale;
  return fromFloat<D>(f);
}

template <typename S, typename D>
__device__ void copyScalar(const S* src, D* dst, long long begin, long long end, float scale, bool applyScale) {
  for (long long k = begin + threadIdx.x; k < end; k += blockDim.x) dst[k] = convert<S, D>(src[k], scale, applyScale);
}

// Elements [begin, end) of one tensor.
template <typename S, typename D>
__device__ void copyRange(const void* srcv, void* dstv, long long begin, long long end, float scale,
                          bool applyScale) {
  constexpr int kMaxSize = sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D);
  constexpr int V = 16 / kMaxSize;
  const S* src = static_cast<const S*>(srcv);
  D* dst = static_cast<D*>(dstv);
  // First element at or after `begin` whose source address is vector-aligned.
  const auto srcAddr = reinterpret_cast<uintptr_t>(src + begin);
  const long long head = static_cast<long long>(((V * sizeof(S)) - srcAddr % (V * sizeof(S))) % (V * sizeof(S)) / sizeof(S));
  const long long vbeg = begin + head;
  if (vbeg >= end || reinterpret_cast<uintptr_t>(dst + vbeg) % (V * sizeof(D)) != 0) {
    copyScalar<S, D>(src, dst, begin, end, scale, applyScale);
    return;
  }
  const long long nvec = (end - vbeg) / V;
  copyScalar<S, D>(src, dst, begin, vbeg, scale, applyScale);
  const auto* vsrc = reinterpret_cast<const Vec<S, V>*>(src + vbeg);
  auto* vdst = reinterpret_cast<Vec<D, V>*>(dst + vbeg);
  for (long long k = threadIdx.x; k < nvec; k += blockDim.x) {
    const Vec<S, V> in = vsrc[k];
    Vec<D, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = convert<S, D>(in.v[j], scale, applyScale);
    vdst[k] = out;
  }
  copyScalar<S, D>(src, dst, vbeg + nvec * V, end, scale, applyScale);
}

template <typename S>
__device__ void copyFrom(const Entry& e, long long begin, long long end, float scale, bool applyScale) {
  switch (e.dstType) {
    case static_cast<int>(CopyDtype::F32): copyRange<S, float>(e.src, e.dst, begin, end, scale, applyScale); break;
    case static_cast<int>(CopyDtype::BF16): copyRange<S, __nv_bfloat16>(e.src, e.dst, begin, end, scale, applyScale); break;
    default: copyRange<S, __half>(e.src, e.dst, begin, end, scale, applyScale); break;
  }
}

__global__ void __launch_bounds__(kThreads) multiTensorCopyKernel(const __grid_constant__ Batch b) {
  for (long long c = blockIdx.x; c < b.totalChunks; c += gridDim.x) {
    // The last entry whose first chunk is <= c (entries are in chunk order, none empty).
    int lo = 0, hi = b.count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (b.e[mid].firstChunk <= c) lo = mid; else hi = mid - 1;
    }
    const Entry& e = b.e[lo];
    const long long begin = (c - e.firstChunk) * kChunk;
    const long long end = begin + kChunk < e.numel ? begin + kChunk : e.numel;
    switch (e.srcType) {
      case static_cast<int>(CopyDtype::F32): copyFrom<float>(e, begin, end, b.scale, b.applyScale); break;
      case static_cast<int>(CopyDtype::BF16): copyFrom<__nv_bfloat16>(e, begin, end, b.scale, b.applyScale); break;
      default: copyFrom<__half>(e, begin, end, b.scale, b.applyScale); break;
    }
  }
}

}  // namespace

std::string launchMultiTensorCopy(const CopyItem* items, int count, float scale, void* stream, int device) {
  nccl_detail::DeviceGuard guard(device);
  int sms = 0;
  cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return cudaErrorText(err, "cudaDeviceGetAttribute(MultiProcessorCount)");
  Batch b{};
  b.scale = scale;
  b.applyScale = scale != 1.0f;
  auto flush = [&]() -> std::string {
    if (b.count == 0) return "";
    const long long cap = static_cast<long long>(sms) * kBlocksPerSm;
    const auto blocks = static_cast<unsigned>(b.totalChunks < cap ? b.totalChunks : cap);
    multiTensorCopyKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(b);
    const cudaError_t launchErr = cudaGetLastError();
    b.count = 0;
    b.totalChunks = 0;
    return launchErr == cudaSuccess ? "" : cudaErrorText(launchErr, "multiTensorCopyKernel launch");
  };
  for (int i = 0; i < count; ++i) {
    if (items[i].numel <= 0) continue;
    Entry& e = b.e[b.count++];
    e.src = items[i].src;
    e.dst = items[i].dst;
    e.numel = items[i].numel;
    e.firstChunk = b.totalChunks;
    e.srcType = static_cast<int>(items[i].srcType);
    e.dstType = static_cast<int>(items[i].dstType);
    b.totalChunks += (items[i].numel + kChunk - 1) / kChunk;
    if (b.count == kMaxItemsPerLaunch) {
      std::string failed = flush();
      if (!failed.empty()) return failed;
    }
  }
  return flush();
}

}  // namespace tessera::kernels::detail
