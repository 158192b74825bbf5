// Cross-entropy kernels (see cross_entropy.h): one block per row (grid-stride over rows), the
// row read in 16-byte packs where the launcher says so. The partials kernel keeps an online
// (max, sum of exp) per thread (the sum rescaled when the max grows) and combines them over the
// block; the gradient kernel writes exp(x − M) · g/(N·S), minus g/N at the row's target.
#include "kernels/cross_entropy_cuda.h"
#include "kernels/cuda_common.cuh"

namespace tessera::kernels::detail {
namespace {

template <typename T, bool kVec>
__global__ void partialsKernel(const CrossEntropyArgs a) {
  constexpr int V = kVec ? 16 / static_cast<int>(sizeof(T)) : 1;
  const T* __restrict__ logits = static_cast<const T*>(a.logits);
  for (long long r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* row = logits + r * a.ld;
    MaxSum ms{-INFINITY, 0.f};
    for (long long j = threadIdx.x * static_cast<long long>(V); j < a.width; j += static_cast<long long>(blockDim.x) * V) {
      float f[V];
      loadFloats<T, V>(row + j, f);
      float m = ms.m;
#pragma unroll
      for (int k = 0; k < V; ++k) m = fmaxf(m, f[k]);
      if (m == -INFINITY) continue;  // nothing but -inf so far
      float s = ms.s * expf(ms.m - m);
#pragma unroll
      for (int k = 0; k < V; ++k) s += expf(f[k] - m);
      ms = {m, s};
    }
    ms = blockMaxSum(ms);
    if (threadIdx.x == 0) {
      const long long t = a.targets[r] - a.start;
      a.partials[r] = ms.m;
      a.partials[a.rows + r] = ms.s;
      a.partials[2 * a.rows + r] = t >= 0 && t < a.width ? toFloat<T>(row[t]) : 0.f;
    }
  }
}

template <typename T, bool kVec>
__global__ void gradKernel(const CrossEntropyArgs a) {
  constexpr int V = kVec ? 16 / static_cast<int>(sizeof(T)) : 1;
  // No __restrict__: grad may be the logits themselves (crossEntropyGradInPlace); each thread reads
  // its elements before it writes them.
  const T* logits = static_cast<const T*>(a.logits);
  T* grad = static_cast<T*>(a.grad);
  const float gOverN = *a.gOverN;
  for (long long r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* row = logits + r * a.ld;
    T* out = grad + r * a.gradLd;
    const float m = a.rowMax[r], scale = gOverN / a.sumExp[r];
    const long long t = a.targets[r] - a.start;
    for (long long j = threadIdx.x * static_cast<long long>(V); j < a.width; j += static_cast<long long>(blockDim.x) * V) {
      float f[V];
      loadFloats<T, V>(row + j, f);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        f[k] = expf(f[k] - m) * scale;
        if (j + k == t) f[k] -= gOverN;
      }
      storeFloats<T, V>(out + j, f);
    }
  }
}


std::string launchRows(const CrossEntropyArgs& a, const Launch& l, bool grad) {
  if (a.rows <= 0 || a.width <= 0) return "";
  nccl_detail::DeviceGuard guard(l.device);
  auto s = static_cast<cudaStream_t>(l.stream);
  const auto blocks = static_cast<unsigned>(a.rows < (1 << 20) ? a.rows : (1 << 20));
  TESSERA_DISPATCH_ELEM(a.type, T, {
    const int v = a.vec ? 16 / static_cast<int>(sizeof(T)) : 1;
    const int threads = rowThreads(a.width, v, 512);
    if (grad) {
      if (a.vec) gradKernel<T, true><<<blocks, threads, 0, s>>>(a);
      else gradKernel<T, false><<<blocks, threads, 0, s>>>(a);
    } else {
      if (a.vec) partialsKernel<T, true><<<blocks, threads, 0, s>>>(a);
      else partialsKernel<T, false><<<blocks, threads, 0, s>>>(a);
    }
  });
  return lastLaunchError(grad ? "crossEntropyGradKernel" : "crossEntropyPartialsKernel");
}

}  // namespace

std::string launchCrossEntropyPartials(const CrossEntropyArgs& a, const Launch& l) { return launchRows(a, l, false); }
std::string launchCrossEntropyGrad(const CrossEntropyArgs& a, const Launch& l) { return launchRows(a, l, true); }

}  // namespace tessera::kernels::detail
