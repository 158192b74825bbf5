// The multi-tensor AdamW kernel (see multi_tensor_adamw.h). One launch updates up to
// kMaxTensorsPerLaunch tensors: each is cut into chunks of kChunk elements, and blocks walk the
// flattened (tensor, chunk) index grid-stride (a binary search finds the chunk's tensor). Within
// a chunk, threads take 4 elements at a time (16-byte accesses) when the tensor's pointers allow
// it, and the chunk's tail one by one. The tensor list is the kernel's by-value parameter
// (about 2.6 KiB; __grid_constant__: read in place, never copied per thread).
#include "kernels/adamw_math.cuh"
#include "kernels/cuda_common.cuh"
#include "kernels/multi_tensor_adamw_cuda.h"

namespace tessera::kernels::detail {
namespace {

constexpr int kThreads = 512;
constexpr long long kChunk = 65536;  // elements per (tensor, chunk) work item; a multiple of 4
constexpr int kBlocksPerSm = 4;      // 2048 resident threads per SM

struct Entry {
  float* p;
  const float* g;
  float* m;
  float* v;
  __nv_bfloat16* copy;
  long long numel;
  long long firstChunk;  // this tensor's first chunk in the launch
  float decay;
  int vec;  // p, g, m, v 16-byte aligned (and copy 8-byte aligned): 4-wide accesses
};

struct Batch {
  Entry e[kMaxTensorsPerLaunch];
  int count;
  long long totalChunks;
  AdamWScalars s;
  const float* gradScale;  // null: 1
};
static_assert(sizeof(Batch) <= 4000, "the kernel parameter must stay under 4 KiB");

__device__ __forceinline__ void updateOne(const Entry& e, long long i, float scale, const AdamWScalars& s) {
  float p = e.p[i], m = e.m[i], v = e.v[i];
  adamwUpdate(p, __fmul_rn(e.g[i], scale), m, v, e.decay, s);
  e.p[i] = p;
  e.m[i] = m;
  e.v[i] = v;
  if (e.copy != nullptr) e.copy[i] = __float2bfloat16_rn(p);
}

__global__ void __launch_bounds__(kThreads) multiTensorAdamWKernel(const __grid_constant__ Batch b) {
  // Gradients read scaled (clipping's coefficient): g * 1 is g exactly, so no scale costs nothing.
  const float scale = b.gradScale != nullptr ? *b.gradScale : 1.0f;
  for (long long c = blockIdx.x; c < b.totalChunks; c += gridDim.x) {
    int lo = 0, hi = b.count - 1;  // the last entry whose first chunk is <= c
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (b.e[mid].firstChunk <= c) lo = mid;
      else hi = mid - 1;
    }
    const Entry& e = b.e[lo];
    const long long begin = (c - e.firstChunk) * kChunk;
    const long long end = begin + kChunk < e.numel ? begin + kChunk : e.numel;
    long long scalarFrom = begin;
    if (e.vec) {
      const long long vend = begin + (end - begin) / 4 * 4;
      for (long long i = begin + 4LL * threadIdx.x; i < vend; i += 4LL * blockDim.x) {
        float p[4], g[4], m[4], v[4];
        loadFloats<float, 4>(e.p + i, p);
        loadFloats<float, 4>(e.g + i, g);
        loadFloats<float, 4>(e.m + i, m);
        loadFloats<float, 4>(e.v + i, v);
#pragma unroll
        for (int k = 0; k < 4; ++k) adamwUpdate(p[k], __fmul_rn(g[k], scale), m[k], v[k], e.decay, b.s);
        storeFloats<float, 4>(e.p + i, p);
        storeFloats<float, 4>(e.m + i, m);
        storeFloats<float, 4>(e.v + i, v);
        if (e.copy != nullptr) storeFloats<__nv_bfloat16, 4>(e.copy + i, p);
      }
      scalarFrom = vend;
    }
    for (long long i = scalarFrom + threadIdx.x; i < end; i += blockDim.x) updateOne(e, i, scale, b.s);
  }
}

bool aligned(const void* p, unsigned bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

std::string launchMultiTensorAdamW(const AdamWTensor* ts, int count, const AdamWScalars& s, const Launch& l,
                                   const float* gradScale) {
  nccl_detail::DeviceGuard guard(l.device);
  const long long cap = static_cast<long long>(smCount(l.device)) * kBlocksPerSm;
  Batch b{};
  b.s = s;
  b.gradScale = gradScale;
  auto flush = [&]() -> std::string {
    if (b.count == 0) return "";
    const auto blocks = static_cast<unsigned>(b.totalChunks < cap ? b.totalChunks : cap);
    multiTensorAdamWKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(l.stream)>>>(b);
    b.count = 0;
    b.totalChunks = 0;
    return lastLaunchError("multiTensorAdamWKernel");
  };
  for (int i = 0; i < count; ++i) {
    const AdamWTensor& t = ts[i];
    if (t.numel <= 0) continue;
    Entry& e = b.e[b.count++];
    e.p = t.p;
    e.g = t.g;
    e.m = t.m;
    e.v = t.v;
    e.copy = static_cast<__nv_bfloat16*>(t.copy);
    e.numel = t.numel;
    e.firstChunk = b.totalChunks;
    e.decay = t.decay;
    e.vec = aligned(t.p, 16) && aligned(t.g, 16) && aligned(t.m, 16) && aligned(t.v, 16) &&
            (t.copy == nullptr || aligned(t.copy, 8));
    b.totalChunks += (t.numel + kChunk - 1) / kChunk;
    if (b.count == kMaxTensorsPerLaunch) {
      std::string err = flush();
      if (!err.empty()) return err;
    }
  }
  return flush();
}

}  // namespace tessera::kernels::detail
