#pragma once
// Internal device helpers of the fused kernels (*_cuda.cu only): element conversions, vector
// loads (typed at compile or at run time), block reductions, the column-sum of per-block partials,
// and the launch prologue.
// Conventions: math in fp32; loads convert to fp32 exactly; stores round to nearest even (as
// ATen's casts do); no fast-math intrinsics where the CPU reference uses the exact function
// (expf, erff, sqrtf and division are the IEEE/CUDA-accurate versions).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "comm/nccl/cuda_glue.h"
#include "kernels/launch.h"

namespace tessera::kernels::detail {

template <typename T>
__device__ __forceinline__ float toFloat(T x);
template <>
__device__ __forceinline__ float toFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float toFloat<__half>(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T fromFloat(float x);
template <>
__device__ __forceinline__ float fromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half fromFloat<__half>(float x) { return __float2half_rn(x); }

// V elements moved as one aligned access (V * sizeof(T) bytes: 16 for 4 floats or 8 halves).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Loads V consecutive elements at p (aligned to V * sizeof(T) when V > 1) as floats.
template <typename T, int V>
__device__ __forceinline__ void loadFloats(const T* p, float (&out)[V]) {
  const Pack<T, V> in = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = toFloat<T>(in.v[k]);
}

template <typename T, int V>
__device__ __forceinline__ void storeFloats(T* p, const float (&in)[V]) {
  Pack<T, V> out;
#pragma unroll
  for (int k = 0; k < V; ++k) out.v[k] = fromFloat<T>(in[k]);
  *reinterpret_cast<Pack<T, V>*>(p) = out;
}

// loadFloats / storeFloats of p[i..i+V) where p's element type is known only at run time (a
// value uniform across the block: no divergence). For tensors whose type is not a template
// parameter (a residual branch, or its gradient, in another dtype than the row).
template <int V>
__device__ __forceinline__ void loadAs(ElemType t, const void* p, long long i, float (&out)[V]) {
  if (t == ElemType::F32) loadFloats<float, V>(static_cast<const float*>(p) + i, out);
  else if (t == ElemType::BF16) loadFloats<__nv_bfloat16, V>(static_cast<const __nv_bfloat16*>(p) + i, out);
  else loadFloats<__half, V>(static_cast<const __half*>(p) + i, out);
}
template <int V>
__device__ __forceinline__ void storeAs(ElemType t, void* p, long long i, const float (&in)[V]) {
  if (t == ElemType::F32) storeFloats<float, V>(static_cast<float*>(p) + i, in);
  else if (t == ElemType::BF16) storeFloats<__nv_bfloat16, V>(static_cast<__nv_bfloat16*>(p) + i, in);
  else storeFloats<__half, V>(static_cast<__half*>(p) + i, in);
}

__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float2 warpSum2(float2 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
  }
  return v;
}

// Sum of v over the block, returned to every thread. Every thread of the block must call it
// (blockDim.x a multiple of 32, at most 1024). Safe to call repeatedly.
__device__ __forceinline__ float2 blockSum2(float2 v) {
  __shared__ float2 part[32];
  v = warpSum2(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // a previous call's readers are done with part
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float2 w = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : make_float2(0.f, 0.f);
    w = warpSum2(w);
    if (lane == 0) part[0] = w;
  }
  __syncthreads();
  return part[0];
}

__device__ __forceinline__ float blockSum(float v) { return blockSum2(make_float2(v, 0.f)).x; }

// (max, sum of exp(x - max)) pairs, combined; a max of -inf means "no element yet" (sum 0).
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ MaxSum blockMaxSum(MaxSum v) {
  __shared__ MaxSum part[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = combine(v, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    MaxSum w = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : MaxSum{-INFINITY, 0.f};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      MaxSum other{__shfl_xor_sync(0xffffffffu, w.m, o), __shfl_xor_sync(0xffffffffu, w.s, o)};
      w = combine(w, other);
    }
    if (lane == 0) part[0] = w;
  }
  __syncthreads();
  return part[0];
}

// out[c] = Σ_{g < groups} partial[g · cols + c] for c < split, out2[c − split] the same for
// split <= c < cols (two outputs from one launch: a norm's weight and bias gradients): the second
// step of the column reductions. A block of 32 × kColumnLanes threads owns 32 columns (each warp
// reads 32 consecutive floats of a row); lane y adds the rows g ≡ y (mod kColumnLanes) in
// increasing g, then lane 0 adds the lanes' sums in lane order: a fixed order (deterministic).
constexpr int kColumnLanes = 16;
template <int kUnused = 0>
__global__ void columnSumKernel(const float* __restrict__ partial, long long groups, long long cols, long long split,
                                float* __restrict__ out, float* __restrict__ out2) {
  __shared__ float lanes[kColumnLanes][33];
  const long long c = blockIdx.x * 32LL + threadIdx.x;
  float s = 0.f;
  if (c < cols) {
    for (long long g = threadIdx.y; g < groups; g += kColumnLanes) s += partial[g * cols + c];
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.f;
#pragma unroll
    for (int y = 0; y < kColumnLanes; ++y) t += lanes[y][threadIdx.x];
    if (c < split) out[c] = t;
    else out2[c - split] = t;
  }
}

inline std::string cudaErrorText(cudaError_t err, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

// The launch's error, if any ("" when none), naming the kernel.
inline std::string lastLaunchError(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? "" : cudaErrorText(err, kernel);
}

inline int smCount(int device) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) sms = 132;
  return sms;
}

// columnSumKernel over [groups, cols] partials into out [split] and out2 [cols − split] (out2 may
// be null when split == cols).
inline std::string launchColumnSum(const float* partial, long long groups, long long cols, float* out,
                                   const Launch& l, long long split = -1, float* out2 = nullptr) {
  if (cols <= 0) return "";
  if (split < 0) split = cols;
  const long long blocks = (cols + 31) / 32;
  columnSumKernel<<<static_cast<unsigned>(blocks), dim3(32, kColumnLanes), 0, static_cast<cudaStream_t>(l.stream)>>>(
      partial, groups, cols, split, out, out2);
  return lastLaunchError("columnSumKernel");
}

// Threads for one block per row of `width` elements moved V at a time: a multiple of 32, at
// most `cap`, no more than the row needs.
inline int rowThreads(long long width, int v, int cap) {
  long long need = (width + v - 1) / v;
  need = (need + 31) / 32 * 32;
  if (need < 32) need = 32;
  return static_cast<int>(need < cap ? need : cap);
}

}  // namespace tessera::kernels::detail

// Calls BODY with `T` bound to the C++ element type of ElemType `e`.
#define TESSERA_DISPATCH_ELEM(e, T, ...)                               \
  do {                                                                 \
    switch (e) {                                                       \
      case ::tessera::kernels::detail::ElemType::F32: {                \
        using T = float;                                               \
        __VA_ARGS__;                                                   \
        break;                                                         \
      }                                                                \
      case ::tessera::kernels::detail::ElemType::BF16: {               \
        using T = __nv_bfloat16;                                       \
        __VA_ARGS__;                                                   \
        break;                                                         \
      }                                                                \
      default: {                                                       \
        using T = __half;                                              \
        __VA_ARGS__;                                                   \
        break;                                                         \
      }                                                                \
    }                                                                  \
  } while (0)
