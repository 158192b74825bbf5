// The FP8 cast kernels (see fp8_cuda.h): amaxes, then codes (and their transpose) in one pass.
// The encoding is fp8/format.cpp's, in float32: every step (scaling by a power of two, rounding to
// an integer with ties to even) is exact, so the codes equal the CPU reference's bit for bit.
#include "kernels/cuda_common.cuh"
#include "kernels/fp8_cuda.h"

#include <algorithm>

namespace tessera::kernels::detail {
namespace {

constexpr int kTile = 32, kRowsPerThread = 4;  // a 32 × 32 tile per block of 32 × 8 threads

__device__ __forceinline__ float warpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The max over the block (every thread calls; blockDim a multiple of 32), to every thread.
__device__ __forceinline__ float blockMax(float v) {
  __shared__ float part[32];
  const int t = threadIdx.x + threadIdx.y * blockDim.x, lane = t & 31, warp = t >> 5;
  const int warps = (blockDim.x * blockDim.y) >> 5;
  v = warpMax(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? part[lane] : 0.f;
    w = warpMax(w);
    if (lane == 0) part[0] = w;
  }
  __syncthreads();
  return part[0];
}

// Non-negative floats order as their bit patterns do, so an int atomicMax is a float max.
__device__ __forceinline__ void atomicMaxNonNegative(float* at, float v) {
  atomicMax(reinterpret_cast<int*>(at), __float_as_int(v));
}

template <typename T>
__global__ void amaxTensorKernel(const T* __restrict__ x, long long n, float* amax) {
  float m = 0.f;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(toFloat<T>(x[i])));
  m = blockMax(m);
  if (threadIdx.x == 0) atomicMaxNonNegative(amax, m);
}

template <typename T>
__global__ void amaxRowsKernel(const T* __restrict__ x, long long cols, float* amax) {
  const T* row = x + blockIdx.x * cols;
  float m = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(toFloat<T>(row[c])));
  m = blockMax(m);
  if (threadIdx.x == 0) amax[blockIdx.x] = m;
}

// Block (32, 8) over 32 columns and a stripe of rows; the stripes' maxima meet in an atomic.
template <typename T>
__global__ void amaxColsKernel(const T* __restrict__ x, long long rows, long long cols, long long stripe,
                               float* amax) {
  __shared__ float part[8][33];
  const long long c = blockIdx.x * 32LL + threadIdx.x;
  const long long r0 = blockIdx.y * stripe, r1 = min(rows, r0 + stripe);
  float m = 0.f;
  if (c < cols)
    for (long long r = r0 + threadIdx.y; r < r1; r += 8) m = fmaxf(m, fabsf(toFloat<T>(x[r * cols + c])));
  part[threadIdx.y][threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
#pragma unroll
    for (int y = 1; y < 8; ++y) m = fmaxf(m, part[y][threadIdx.x]);
    atomicMaxNonNegative(amax + c, m);
  }
}

__device__ __forceinline__ float scaleOf(float amax, bool e5m2) {
  if (!(amax > 0.f) || isinf(amax)) return 1.f;
  return __fdiv_rn(e5m2 ? 57344.f : 448.f, amax);
}

// fp8::encode(v, Saturate) (format.cpp), with whether a finite v was clamped to the largest value.
__device__ __forceinline__ uint8_t encodeFp8(float v, bool e5m2, bool& saturated) {
  const int manBits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  const float top = e5m2 ? 57344.f : 448.f;
  const uint8_t sign = signbit(v) ? 0x80 : 0x00, largest = e5m2 ? 0x7b : 0x7e;
  if (isnan(v)) return sign | (e5m2 ? 0x7e : 0x7f);
  const float a = fabsf(v);
  if (isinf(a)) return sign | largest;
  if (a == 0.f) return sign;
  const int minExp = 1 - bias;
  const int e = max(ilogbf(a), minExp), quantum = e - manBits;
  const float rounded = ldexpf(rintf(ldexpf(a, -quantum)), quantum);
  if (rounded > top) {
    saturated = true;
    return sign | largest;
  }
  if (rounded == 0.f) return sign;
  const int re = ilogbf(rounded);
  if (re < minExp) return sign | static_cast<uint8_t>(ldexpf(rounded, manBits - minExp));
  const unsigned man = static_cast<unsigned>(ldexpf(rounded, manBits - re)) - (1u << manBits);
  return sign | static_cast<uint8_t>((static_cast<unsigned>(re + bias) << manBits) | man);
}

template <typename T>
__global__ void castKernel(const Fp8CastArgs a) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const T* x = static_cast<const T*>(a.x);
  const long long r0 = blockIdx.x * static_cast<long long>(kTile), c0 = blockIdx.y * static_cast<long long>(kTile);
  const long long c = c0 + threadIdx.x;
  float under = 0.f, sat = 0.f;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int tr = threadIdx.y + 8 * i;
    const long long r = r0 + tr;
    if (r >= a.rows || c >= a.cols) continue;
    const long long which = a.axis == Fp8Axis::Tensor ? 0 : a.axis == Fp8Axis::Rows ? r : c;
    const float scale = scaleOf(a.amax[which], a.e5m2);
    const bool writesScale = a.axis == Fp8Axis::Tensor ? (r == 0 && c == 0) : a.axis == Fp8Axis::Rows ? c == 0 : r == 0;
    if (writesScale) a.scaleInv[which] = __fdiv_rn(1.f, scale);
    const float v = toFloat<T>(x[r * a.cols + c]);
    bool s = false;
    const uint8_t code = encodeFp8(__fmul_rn(v, scale), a.e5m2, s);
    if (isfinite(v) && v != 0.f && (code & 0x7f) == 0) under += 1.f;
    if (s && isfinite(__fmul_rn(v, scale))) sat += 1.f;
    if (a.codes) a.codes[r * a.cols + c] = code;
    tile[tr][threadIdx.x] = code;
  }
  if (a.codesT) {
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int tc = threadIdx.y + 8 * i;
      const long long cT = c0 + tc, rT = r0 + threadIdx.x;
      if (cT < a.cols && rT < a.rows) a.codesT[cT * a.rows + rT] = tile[threadIdx.x][tc];
    }
  }
  if (a.counts) {
    under = warpSum(under);
    sat = warpSum(sat);
    if ((threadIdx.x & 31) == 0) {
      if (under > 0.f) atomicAdd(a.counts, under);
      if (sat > 0.f) atomicAdd(a.counts + 1, sat);
    }
  }
}

}  // namespace

std::string launchFp8Amax(const void* x, ElemType type, long long rows, long long cols, Fp8Axis axis, float* amax,
                          const Launch& l) {
  nccl_detail::DeviceGuard guard(l.device);
  const auto stream = static_cast<cudaStream_t>(l.stream);
  const long long n = axis == Fp8Axis::Tensor ? 1 : axis == Fp8Axis::Rows ? rows : cols;
  cudaError_t err = cudaMemsetAsync(amax, 0, static_cast<size_t>(n) * sizeof(float), stream);
  if (err != cudaSuccess) return cudaErrorText(err, "cudaMemsetAsync (fp8 amax)");
  if (rows <= 0 || cols <= 0) return "";
  TESSERA_DISPATCH_ELEM(type, T, {
    const T* p = static_cast<const T*>(x);
    if (axis == Fp8Axis::Tensor) {
      const long long blocks = std::min((rows * cols + 255) / 256, 4LL * smCount(l.device));
      amaxTensorKernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, rows * cols, amax);
    } else if (axis == Fp8Axis::Rows) {
      amaxRowsKernel<T><<<static_cast<unsigned>(rows), rowThreads(cols, 1, 256), 0, stream>>>(p, cols, amax);
    } else {
      const long long colBlocks = (cols + 31) / 32;
      long long stripes = std::max(1LL, std::min((rows + 255) / 256, 4LL * smCount(l.device) / colBlocks));
      stripes = std::min(stripes, 65535LL);
      const long long stripe = (rows + stripes - 1) / stripes;
      amaxColsKernel<T><<<dim3(static_cast<unsigned>(colBlocks), static_cast<unsigned>(stripes)), dim3(32, 8), 0,
                          stream>>>(p, rows, cols, stripe, amax);
    }
  });
  return lastLaunchError("fp8 amax kernel");
}

std::string launchFp8Cast(const Fp8CastArgs& a, const Launch& l) {
  if (a.rows <= 0 || a.cols <= 0) return "";
  nccl_detail::DeviceGuard guard(l.device);
  const long long colTiles = (a.cols + kTile - 1) / kTile;
  if (colTiles > 65535) return "fp8 cast: more than 65535 × 32 columns";
  const dim3 grid(static_cast<unsigned>((a.rows + kTile - 1) / kTile), static_cast<unsigned>(colTiles));
  TESSERA_DISPATCH_ELEM(a.type, T, { castKernel<T><<<grid, dim3(32, 8), 0, static_cast<cudaStream_t>(l.stream)>>>(a); });
  return lastLaunchError("fp8 castKernel");
}

}  // namespace tessera::kernels::detail
