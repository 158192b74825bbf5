// RMSNorm / LayerNorm kernels (see norm.h for the math, norm_cuda.h for the launchers).
// Forward: one block per row (grid-stride over rows): the row's sums by a block reduction, then
// y written in one more pass over the row (the row's second read hits L1/L2). Backward: a grid
// of `groups` blocks, each walking rows r ≡ blockIdx.x (mod groups): per row the two sums
// Σ g', Σ g'·x̂ (one block reduction), then gx; meanwhile each thread adds gy·x̂ (and gy) of the
// columns it always owns into shared-memory accumulators (no sharing: no atomics), written out
// as the block's partial row at the end ([gw | gb] side by side); one columnSumKernel then sums
// the partial rows into gw and gb. Rows are contiguous; accesses are 4 wide (16 bytes of fp32, 8
// of bf16) when the launcher says so.
// Residual add (add_norm.h): the forward's first pass reads x and the branch, stores s = x +
// branch (rounded to x's type) and reduces s; the later passes read s back (the same thread's
// own stores). The backward adds the residual gradient to gx before its one rounding and may
// store gx a second time in the branch's dtype.
#include "kernels/cuda_common.cuh"
#include "kernels/norm_cuda.h"

namespace tessera::kernels::detail {
namespace {

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<TX>, Tag<TY>) for the supported (x, y) pairs: equal types, or fp32 x with a
// 16-bit y (autocast). Returns false for any other pair.
template <typename F>
bool dispatchPair(ElemType x, ElemType y, F&& f) {
  if (x == y) {
    TESSERA_DISPATCH_ELEM(x, T, f(Tag<T>{}, Tag<T>{}));
    return true;
  }
  if (x != ElemType::F32) return false;
  if (y == ElemType::BF16) {
    f(Tag<float>{}, Tag<__nv_bfloat16>{});
  } else {
    f(Tag<float>{}, Tag<__half>{});
  }
  return true;
}

template <typename TX, typename TY, int V, bool kCentered>
__global__ void normForwardKernel(const NormForwardArgs a) {
  const TX* __restrict__ x = static_cast<const TX*>(a.x);
  TY* __restrict__ y = static_cast<TY*>(a.y);
  const long long d = a.d;
  const float invD = 1.0f / static_cast<float>(d);
  const bool add = a.branch != nullptr;
  for (long long r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const TX* xr = x + r * d;
    TX* sr = add ? static_cast<TX*>(a.s) + r * d : nullptr;
    TY* yr = y + r * d;
    // The row's values at j..j+V: x, or s = x + branch (computed and stored on the first pass).
    auto load = [&](long long j, float (&f)[V], bool first) {
      if (!add) {
        loadFloats<TX, V>(xr + j, f);
        return;
      }
      if (!first) {
        loadFloats<TX, V>(sr + j, f);
        return;
      }
      float b[V];
      loadFloats<TX, V>(xr + j, f);
      loadAs<V>(a.branchType, a.branch, r * d + j, b);
#pragma unroll
      for (int k = 0; k < V; ++k) f[k] = toFloat<TX>(fromFloat<TX>(__fadd_rn(f[k], b[k])));
      storeFloats<TX, V>(sr + j, f);
    };
    float mean = 0.f;
    if (kCentered) {
      float s = 0.f;
      for (long long j = threadIdx.x * static_cast<long long>(V); j < d; j += static_cast<long long>(blockDim.x) * V) {
        float f[V];
        load(j, f, true);
#pragma unroll
        for (int k = 0; k < V; ++k) s += f[k];
      }
      mean = blockSum(s) * invD;
    }
    float s2 = 0.f;
    for (long long j = threadIdx.x * static_cast<long long>(V); j < d; j += static_cast<long long>(blockDim.x) * V) {
      float f[V];
      load(j, f, !kCentered);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float c = f[k] - mean;
        s2 += c * c;
      }
    }
    const float rstd = 1.0f / sqrtf(blockSum(s2) * invD + a.eps);
    for (long long j = threadIdx.x * static_cast<long long>(V); j < d; j += static_cast<long long>(blockDim.x) * V) {
      float f[V], w[V], out[V];
      load(j, f, false);
      loadFloats<float, V>(a.weight + j, w);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = __fmul_rn(__fmul_rn(f[k] - mean, rstd), w[k]);
      if (kCentered && a.bias != nullptr) {
        float b[V];
        loadFloats<float, V>(a.bias + j, b);
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] = __fadd_rn(out[k], b[k]);
      }
      storeFloats<TY, V>(yr + j, out);
    }
    if (threadIdx.x == 0) {
      a.rstd[r] = rstd;
      if (kCentered) a.mean[r] = mean;
    }
  }
}

template <typename TX, typename TY, int V, bool kCentered, bool kBias>
__global__ void normBackwardKernel(const NormBackwardArgs a) {
  extern __shared__ float acc[];  // [d]: Σ gy·x̂ of this block's rows; then [d]: Σ gy (kBias)
  const TY* __restrict__ gy = static_cast<const TY*>(a.gy);
  const TX* __restrict__ x = static_cast<const TX*>(a.x);
  TX* __restrict__ gx = static_cast<TX*>(a.gx);
  const long long d = a.d;
  const float invD = 1.0f / static_cast<float>(d);
  const long long first = threadIdx.x * static_cast<long long>(V), stride = static_cast<long long>(blockDim.x) * V;
  for (long long j = first; j < d; j += stride) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc[j + k] = 0.f;
      if (kBias) acc[d + j + k] = 0.f;
    }
  }
  for (long long r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const float mean = kCentered ? a.mean[r] : 0.f, rstd = a.rstd[r];
    const TY* gr = gy + r * d;
    const TX* xr = x + r * d;
    float2 s = make_float2(0.f, 0.f);  // (Σ g', Σ g'·x̂)
    for (long long j = first; j < d; j += stride) {
      float g[V], f[V], w[V];
      loadFloats<TY, V>(gr + j, g);
      loadFloats<TX, V>(xr + j, f);
      loadFloats<float, V>(a.weight + j, w);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = (f[k] - mean) * rstd, gp = g[k] * w[k];
        s.x += gp;
        s.y += gp * xhat;
        acc[j + k] += g[k] * xhat;
        if (kBias) acc[d + j + k] += g[k];
      }
    }
    s = blockSum2(s);
    const float c1 = kCentered ? s.x * invD : 0.f, c2 = s.y * invD;
    TX* gxr = gx + r * d;
    for (long long j = first; j < d; j += stride) {
      float g[V], f[V], w[V], out[V];
      loadFloats<TY, V>(gr + j, g);
      loadFloats<TX, V>(xr + j, f);
      loadFloats<float, V>(a.weight + j, w);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = (f[k] - mean) * rstd;
        out[k] = (g[k] * w[k] - c1 - xhat * c2) * rstd;
      }
      if (a.gres != nullptr) {
        float gr[V];
        loadFloats<TX, V>(static_cast<const TX*>(a.gres) + r * d + j, gr);
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] += gr[k];
      }
      storeFloats<TX, V>(gxr + j, out);
      if (a.gbranch != nullptr) storeAs<V>(a.gbranchType, a.gbranch, r * d + j, out);
    }
  }
  float* part = a.partial + blockIdx.x * (kBias ? 2 * d : d);  // [gw | gb] partials of this block
  for (long long j = first; j < d; j += stride) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      part[j + k] = acc[j + k];
      if (kBias) part[d + j + k] = acc[d + j + k];
    }
  }
}

template <typename Kernel>
std::string allowSharedMemory(Kernel kernel, size_t bytes, int device) {
  if (bytes <= 48 * 1024) return "";
  int optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return cudaErrorText(err, "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  if (bytes + 1024 > static_cast<size_t>(optin)) {
    return "the row (d) is too wide for the fused norm backward: " + std::to_string(bytes) +
           " bytes of shared memory needed, " + std::to_string(optin) + " available";
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  return err == cudaSuccess ? "" : cudaErrorText(err, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
}

constexpr int kMaxThreads = 512;

}  // namespace

std::string launchNormForward(const NormForwardArgs& a, const Launch& l) {
  if (a.rows <= 0 || a.d <= 0) return "";
  nccl_detail::DeviceGuard guard(l.device);
  std::string err;
  const bool ok = dispatchPair(a.xType, a.yType, [&](auto tx, auto ty) {
    using TX = typename decltype(tx)::type;
    using TY = typename decltype(ty)::type;
    const int v = a.vec4 ? 4 : 1;
    const int threads = rowThreads(a.d, v, kMaxThreads);
    const auto blocks = static_cast<unsigned>(a.rows < (1 << 20) ? a.rows : (1 << 20));
    auto s = static_cast<cudaStream_t>(l.stream);
    if (a.vec4) {
      if (a.centered) normForwardKernel<TX, TY, 4, true><<<blocks, threads, 0, s>>>(a);
      else normForwardKernel<TX, TY, 4, false><<<blocks, threads, 0, s>>>(a);
    } else {
      if (a.centered) normForwardKernel<TX, TY, 1, true><<<blocks, threads, 0, s>>>(a);
      else normForwardKernel<TX, TY, 1, false><<<blocks, threads, 0, s>>>(a);
    }
    err = lastLaunchError("normForwardKernel");
  });
  return ok ? err : "unsupported pair of input and output dtypes";
}

long long normBackwardGroups(long long rows, int device) {
  const long long cap = 4LL * smCount(device);
  return rows < cap ? (rows > 0 ? rows : 1) : cap;
}

std::string launchNormBackward(const NormBackwardArgs& a, const Launch& l) {
  if (a.rows <= 0 || a.d <= 0) return "";
  nccl_detail::DeviceGuard guard(l.device);
  std::string err;
  const bool ok = dispatchPair(a.xType, a.gyType, [&](auto tx, auto ty) {
    using TX = typename decltype(tx)::type;
    using TY = typename decltype(ty)::type;
    const int v = a.vec4 ? 4 : 1;
    const int threads = rowThreads(a.d, v, kMaxThreads);
    const bool bias = a.gb != nullptr;
    const size_t smem = static_cast<size_t>(a.d) * (bias ? 2 : 1) * sizeof(float);
    auto s = static_cast<cudaStream_t>(l.stream);
    const auto blocks = static_cast<unsigned>(a.groups);
    auto launch = [&](auto kernel) {
      err = allowSharedMemory(kernel, smem, l.device);
      if (!err.empty()) return;
      kernel<<<blocks, threads, smem, s>>>(a);
      err = lastLaunchError("normBackwardKernel");
    };
    if (a.vec4) {
      if (!a.centered) launch(normBackwardKernel<TX, TY, 4, false, false>);
      else if (bias) launch(normBackwardKernel<TX, TY, 4, true, true>);
      else launch(normBackwardKernel<TX, TY, 4, true, false>);
    } else {
      if (!a.centered) launch(normBackwardKernel<TX, TY, 1, false, false>);
      else if (bias) launch(normBackwardKernel<TX, TY, 1, true, true>);
      else launch(normBackwardKernel<TX, TY, 1, true, false>);
    }
  });
  if (!ok) return "unsupported pair of input and gradient dtypes";
  if (!err.empty()) return err;
  if (a.gb == nullptr) return launchColumnSum(a.partial, a.groups, a.d, a.gw, l);
  return launchColumnSum(a.partial, a.groups, 2 * a.d, a.gw, l, a.d, a.gb);
}

}  // namespace tessera::kernels::detail
