// SwiGLU and bias + GELU kernels (see activations.h). The elementwise passes walk (row, column
// pack) items grid-stride. The bias + GELU backward runs on a 2-D grid: x over column packs
// (consecutive threads, consecutive columns: coalesced), y over groups of rows; each thread
// walks its group's rows for its columns, writes gh and keeps the column sums of gz in
// registers, then stores them as the group's partial row; columnSumKernel adds the groups.
#include "kernels/activations_cuda.h"
#include "kernels/cuda_common.cuh"

namespace tessera::kernels::detail {
namespace {

constexpr int kThreads = 256;
constexpr float kSqrtHalf = 0.70710678118654752440f;       // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;     // 1 / sqrt(2 pi)

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu(float z) { return z * 0.5f * (1.0f + erff(z * kSqrtHalf)); }
__device__ __forceinline__ float geluGrad(float gy, float z) {
  const float cdf = 0.5f * (1.0f + erff(z * kSqrtHalf));
  const float pdf = kInvSqrt2Pi * expf(-0.5f * z * z);
  return gy * (cdf + z * pdf);
}

unsigned gridFor(long long items, int device) {
  const long long cap = static_cast<long long>(smCount(device)) * 16;
  long long blocks = (items + kThreads - 1) / kThreads;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// Calls f(row, first column of the pack) for every V-wide pack of a [rows, ffn] grid, grid-stride.
template <int V, typename F>
__device__ __forceinline__ void forEachPack(long long rows, long long ffn, F&& f) {
  const long long packs = ffn / V, total = rows * packs;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = idx / packs;
    f(r, (idx - r * packs) * V);
  }
}

template <typename T, int V>
__global__ void swigluForwardKernel(const SwigluArgs a) {
  const T* __restrict__ h = static_cast<const T*>(a.h);
  T* __restrict__ y = static_cast<T*>(a.y);
  forEachPack<V>(a.rows, a.ffn, [&](long long r, long long c) {
    float g[V], u[V], out[V];
    loadFloats<T, V>(h + r * 2 * a.ffn + c, g);
    loadFloats<T, V>(h + r * 2 * a.ffn + a.ffn + c, u);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
    storeFloats<T, V>(y + r * a.ffn + c, out);
  });
}

template <typename T, int V>
__global__ void swigluBackwardKernel(const SwigluArgs a) {
  const T* __restrict__ h = static_cast<const T*>(a.h);
  const T* __restrict__ gy = static_cast<const T*>(a.gy);
  T* __restrict__ gh = static_cast<T*>(a.gh);
  forEachPack<V>(a.rows, a.ffn, [&](long long r, long long c) {
    float g[V], u[V], go[V], gg[V], gu[V];
    loadFloats<T, V>(h + r * 2 * a.ffn + c, g);
    loadFloats<T, V>(h + r * 2 * a.ffn + a.ffn + c, u);
    loadFloats<T, V>(gy + r * a.ffn + c, go);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float s = sigmoid(g[k]);
      gg[k] = go[k] * u[k] * (s * (1.0f + g[k] * (1.0f - s)));
      gu[k] = go[k] * (g[k] * s);
    }
    storeFloats<T, V>(gh + r * 2 * a.ffn + c, gg);
    storeFloats<T, V>(gh + r * 2 * a.ffn + a.ffn + c, gu);
  });
}

template <typename T, int V>
__global__ void biasGeluForwardKernel(const BiasGeluArgs a) {
  const T* __restrict__ h = static_cast<const T*>(a.h);
  T* __restrict__ y = static_cast<T*>(a.y);
  forEachPack<V>(a.rows, a.ffn, [&](long long r, long long c) {
    float x[V], b[V], out[V];
    loadFloats<T, V>(h + r * a.ffn + c, x);
    loadFloats<float, V>(a.bias + c, b);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = gelu(x[k] + b[k]);
    storeFloats<T, V>(y + r * a.ffn + c, out);
  });
}

template <typename T, int V>
__global__ void biasGeluBackwardKernel(const BiasGeluArgs a) {
  const long long c = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) * V;
  if (c >= a.ffn) return;  // no block-wide synchronisation below
  const T* __restrict__ h = static_cast<const T*>(a.h);
  const T* __restrict__ gy = static_cast<const T*>(a.gy);
  T* __restrict__ gh = static_cast<T*>(a.gh);
  const long long per = (a.rows + gridDim.y - 1) / gridDim.y;
  const long long r0 = blockIdx.y * per;
  const long long r1 = r0 + per < a.rows ? r0 + per : a.rows;
  float b[V], sum[V];
  loadFloats<float, V>(a.bias + c, b);
#pragma unroll
  for (int k = 0; k < V; ++k) sum[k] = 0.f;
  for (long long r = r0; r < r1; ++r) {
    float x[V], g[V], out[V];
    loadFloats<T, V>(h + r * a.ffn + c, x);
    loadFloats<T, V>(gy + r * a.ffn + c, g);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      out[k] = geluGrad(g[k], x[k] + b[k]);
      sum[k] += out[k];
    }
    storeFloats<T, V>(gh + r * a.ffn + c, out);
  }
#pragma unroll
  for (int k = 0; k < V; ++k) a.partial[blockIdx.y * a.ffn + c + k] = sum[k];
}

}  // namespace

namespace {

// One grid-stride elementwise kernel over rows · ffn / V items, V = 4 where the launcher allows.
template <template <typename, int> class Kernel, typename Args>
std::string launchElementwise(const Args& a, const Launch& l, const char* name) {
  if (a.rows <= 0 || a.ffn <= 0) return "";
  nccl_detail::DeviceGuard guard(l.device);
  const unsigned blocks = gridFor(a.rows * (a.ffn / (a.vec4 ? 4 : 1)), l.device);
  auto s = static_cast<cudaStream_t>(l.stream);
  TESSERA_DISPATCH_ELEM(a.type, T, {
    if (a.vec4) Kernel<T, 4>::launch(blocks, kThreads, s, a);
    else Kernel<T, 1>::launch(blocks, kThreads, s, a);
  });
  return lastLaunchError(name);
}

#define TESSERA_KERNEL_LAUNCHER(Name, kernel, Args)                                          \
  template <typename T, int V>                                                               \
  struct Name {                                                                              \
    static void launch(unsigned blocks, int threads, cudaStream_t s, const Args& a) {         \
      kernel<T, V><<<blocks, threads, 0, s>>>(a);                                             \
    }                                                                                        \
  };
TESSERA_KERNEL_LAUNCHER(SwigluForward, swigluForwardKernel, SwigluArgs)
TESSERA_KERNEL_LAUNCHER(SwigluBackward, swigluBackwardKernel, SwigluArgs)
TESSERA_KERNEL_LAUNCHER(BiasGeluForward, biasGeluForwardKernel, BiasGeluArgs)
#undef TESSERA_KERNEL_LAUNCHER

}  // namespace

std::string launchSwigluForward(const SwigluArgs& a, const Launch& l) {
  return launchElementwise<SwigluForward>(a, l, "swigluForwardKernel");
}

std::string launchSwigluBackward(const SwigluArgs& a, const Launch& l) {
  return launchElementwise<SwigluBackward>(a, l, "swigluBackwardKernel");
}

std::string launchBiasGeluForward(const BiasGeluArgs& a, const Launch& l) {
  return launchElementwise<BiasGeluForward>(a, l, "biasGeluForwardKernel");
}

long long biasGeluGroups(long long rows, long long ffn, int device) {
  const long long columnBlocks = (ffn + 4LL * kThreads - 1) / (4LL * kThreads);
  long long groups = 8LL * smCount(device) / (columnBlocks > 0 ? columnBlocks : 1);
  if (groups > rows) groups = rows;
  if (groups > 65535) groups = 65535;
  return groups < 1 ? 1 : groups;
}

std::string launchBiasGeluBackward(const BiasGeluArgs& a, const Launch& l) {
  if (a.rows <= 0 || a.ffn <= 0) return "";
  nccl_detail::DeviceGuard guard(l.device);
  const int v = a.vec4 ? 4 : 1;
  const long long columnBlocks = (a.ffn / v + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(columnBlocks), static_cast<unsigned>(a.groups));
  auto s = static_cast<cudaStream_t>(l.stream);
  TESSERA_DISPATCH_ELEM(a.type, T, {
    if (a.vec4) biasGeluBackwardKernel<T, 4><<<grid, kThreads, 0, s>>>(a);
    else biasGeluBackwardKernel<T, 1><<<grid, kThreads, 0, s>>>(a);
  });
  std::string err = lastLaunchError("biasGeluBackwardKernel");
  return err.empty() ? launchColumnSum(a.partial, a.groups, a.ffn, a.gb, l) : err;
}

}  // namespace tessera::kernels::detail
