// The FP8 cast kernels (see fp8_cuda.h): amaxes, then codes (and their transpose) in one pass.
// The encoding is fp8/format.cpp's (the hardware's round-to-nearest-even conversion; NaN and the
// saturation count as the reference has them), so the codes equal the CPU reference's bit for bit.
#include <cuda_fp8.h>

#include "kernels/cuda_common.cuh"
#include "kernels/fp8_cuda.h"

#include <algorithm>

namespace tessera::kernels::detail {
namespace {

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

// V elements per load (16 bytes) when n is a multiple of V and x 16-byte aligned, else 1.
// Four loads in flight per thread (the loop is latency-bound otherwise).
template <typename T, int V>
__global__ void amaxTensorKernel(const T* __restrict__ x, long long n, float* amax) {
  float m = 0.f;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x * V;
  long long i = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) * V;
  for (; i + 3 * stride < n; i += 4 * stride) {
    float v[4][V];
#pragma unroll
    for (int u = 0; u < 4; ++u) loadFloats<T, V>(x + i + u * stride, v[u]);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int k = 0; k < V; ++k) m = fmaxf(m, fabsf(v[u][k]));
  }
  for (; i < n; i += stride) {
    float v[V];
    loadFloats<T, V>(x + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) m = fmaxf(m, fabsf(v[k]));
  }
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

// fp8::encode(v, Saturate) (format.cpp) is the hardware's conversion below, except for NaN: the
// reference keeps its sign (this code), the instruction writes one canonical NaN.
__device__ __forceinline__ uint32_t nanCode(float v, bool e5m2) {
  return (signbit(v) ? 0x80u : 0x00u) | (e5m2 ? 0x7eu : 0x7fu);
}

// Four scaled values to four codes (byte j = value j) with the hardware's paired conversion
// (round to nearest even, saturating to the largest finite value, sm_89+).
__device__ __forceinline__ uint32_t encode4(const float (&s)[4], bool e5m2) {
  const auto f = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(s[0], s[1]), __NV_SATFINITE, f);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(s[2], s[3]), __NV_SATFINITE, f);
  return lo | (hi << 16);
}

// A tile of 32 rows × 128 columns per block of 256 threads: thread t casts 4 consecutive columns
// (4·(t mod 32)) of rows t/32 + 8i, i < 4 (vector loads and one 4-byte store where aligned), then,
// from shared memory, writes 16 bytes of one transposed row (a column of the tile). The four rows
// are loaded before any is converted or stored: x and the codes are not declared apart, so the
// compiler would otherwise wait for each row's stores before the next row's load (a third of the
// memory's pace). kTensor: one scale for the whole tensor (the training recipe's path).
constexpr int kTileRows = 32, kTileCols = 128;

// The tile's codes transposed: thread t writes 16 bytes of transposed row c0 + t/2 (a column of the
// tile), from row r0 + 16·(t mod 2) on. After the tile is complete (__syncthreads()).
__device__ __forceinline__ void writeTransposed(const Fp8CastArgs& a, const uint8_t (&tile)[kTileRows][kTileCols + 4],
                                                long long r0, long long c0, bool vec) {
  const int tc = threadIdx.x >> 1, half = threadIdx.x & 1;  // transposed row c0 + tc, its bytes half·16 ..
  const long long cT = c0 + tc, rT = r0 + 16 * half;
  if (cT < a.cols && rT < a.rows) {
    uint8_t* dst = a.codesT + cT * a.rows + rT;
    const int n = static_cast<int>(min(16LL, a.rows - rT));
    if (vec && n == 16 && a.rows % 16 == 0) {
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        w[q] = tile[16 * half + 4 * q][tc] | (tile[16 * half + 4 * q + 1][tc] << 8) |
               (tile[16 * half + 4 * q + 2][tc] << 16) | (static_cast<uint32_t>(tile[16 * half + 4 * q + 3][tc]) << 24);
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      for (int q = 0; q < n; ++q) dst[q] = tile[16 * half + q][tc];
    }
  }
}

// The block's underflow and saturation counts added to a.counts.
__device__ __forceinline__ void addCounts(const Fp8CastArgs& a, float under, float sat, int lane) {
  // One atomic per block and counter, not per warp: in training most warps see an underflow, and
  // every block's warps adding to the same two words serialised in L2.
  __shared__ float part[2][8];
  const int warp = threadIdx.x >> 5;
  under = warpSum(under);
  sat = warpSum(sat);
  if (lane == 0) part[0][warp] = under, part[1][warp] = sat;
  __syncthreads();
  if (threadIdx.x < 2) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) t += part[threadIdx.x][w];
    if (t > 0.f) atomicAdd(a.counts + threadIdx.x, t);
  }
}

template <typename T, bool kTensor>
__global__ void __launch_bounds__(256) castKernel(const Fp8CastArgs a, bool vec) {
  __shared__ __align__(16) uint8_t tile[kTileRows][kTileCols + 4];
  const T* __restrict__ x = static_cast<const T*>(a.x);
  const long long r0 = blockIdx.x * static_cast<long long>(kTileRows), c0 = blockIdx.y * static_cast<long long>(kTileCols);
  const int lane = threadIdx.x & 31, rowInTile = threadIdx.x >> 5;
  const long long c = c0 + 4 * lane;
  const float tensorScale = kTensor ? scaleOf(a.amax[0], a.e5m2) : 0.f;
  if (kTensor && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) a.scaleInv[0] = __fdiv_rn(1.f, tensorScale);
  // Constant indices only (unrolled loops with guards): a runtime index would put v in local memory.
  float v[4][4];
  int n[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const long long r = r0 + rowInTile + 8 * i;
    n[i] = r < a.rows && c < a.cols ? static_cast<int>(min(4LL, a.cols - c)) : 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) v[i][j] = 0.f;
    if (vec && n[i] == 4) {
      loadFloats<T, 4>(x + r * a.cols + c, v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (j < n[i]) v[i][j] = toFloat<T>(x[r * a.cols + c + j]);
    }
  }
  // Saturated: a finite value that rounds above the largest one (the reference's rounding without
  // saturation: E4M3 above 464, E5M2 from 61440 on, a tie rounding up to 2^16).
  const float satAbove = a.e5m2 ? __int_as_float(__float_as_int(61440.f) - 1) : 464.f;
  float under = 0.f, sat = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int tr = rowInTile + 8 * i;
    const long long r = r0 + tr;
    if (n[i] == 0) continue;
    float sc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float scale = tensorScale;
      if (!kTensor && j < n[i]) {
        if (a.axis == Fp8Axis::Rows) {
          scale = scaleOf(a.amax[r], a.e5m2);
          if (c + j == 0) a.scaleInv[r] = __fdiv_rn(1.f, scale);
        } else {
          scale = scaleOf(a.amax[c + j], a.e5m2);
          if (r == 0) a.scaleInv[c + j] = __fdiv_rn(1.f, scale);
        }
      }
      sc[j] = __fmul_rn(v[i][j], scale);
    }
    uint32_t packed = encode4(sc, a.e5m2);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (isnan(v[i][j])) packed = (packed & ~(0xffu << (8 * j))) | (nanCode(v[i][j], a.e5m2) << (8 * j));
      if (j >= n[i]) packed &= ~(0xffu << (8 * j));
      // Values past the row's end are 0: they count as neither.
      if (v[i][j] != 0.f && ((packed >> (8 * j)) & 0x7fu) == 0) under += 1.f;
      const float m = fabsf(sc[j]);
      if (m > satAbove && !isinf(m)) sat += 1.f;
    }
    *reinterpret_cast<uint32_t*>(&tile[tr][4 * lane]) = packed;
    if (a.codes) {
      if (vec && n[i] == 4) {
        *reinterpret_cast<uint32_t*>(a.codes + r * a.cols + c) = packed;
      } else {
        for (int j = 0; j < n[i]; ++j) a.codes[r * a.cols + c + j] = static_cast<uint8_t>(packed >> (8 * j));
      }
    }
  }
  if (a.codesT) {
    __syncthreads();
    writeTransposed(a, tile, r0, c0, vec);
  }
  if (a.counts) addCounts(a, under, sat, lane);
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
      constexpr int V = 16 / sizeof(T);
      const long long values = rows * cols;
      const bool vec = values % V == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
      const long long blocks = std::min((values / (vec ? V : 1) + 255) / 256, 8LL * smCount(l.device));
      if (vec) {
        amaxTensorKernel<T, V><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, values, amax);
      } else {
        amaxTensorKernel<T, 1><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, values, amax);
      }
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
  const long long colTiles = (a.cols + kTileCols - 1) / kTileCols;
  if (colTiles > 65535) return "fp8 cast: more than 65535 × 128 columns";
  // Vector access: rows of whole 4-element groups, 16-byte aligned buffers (the allocator's).
  const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  const bool vec = a.cols % 4 == 0 && addr(a.x) % 16 == 0 && (!a.codes || addr(a.codes) % 16 == 0) &&
                   (!a.codesT || addr(a.codesT) % 16 == 0);
  const dim3 grid(static_cast<unsigned>((a.rows + kTileRows - 1) / kTileRows), static_cast<unsigned>(colTiles));
  const auto stream = static_cast<cudaStream_t>(l.stream);
  TESSERA_DISPATCH_ELEM(a.type, T, {
    if (a.axis == Fp8Axis::Tensor) {
      castKernel<T, true><<<grid, 256, 0, stream>>>(a, vec);
    } else {
      castKernel<T, false><<<grid, 256, 0, stream>>>(a, vec);
    }
  });
  return lastLaunchError("fp8 castKernel");
}

}  // namespace tessera::kernels::detail
