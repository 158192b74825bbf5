// The rotary kernel (see rotary.h): a grid-stride walk over (row, head, i) work items, i over
// the first half of the head (V = 1 or 2 consecutive i per item); each item reads x_i and
// x_{i+hd/2} and writes both rotated, so the forward can run in place. The backward also walks
// the rest of each row (one element per item) and copies it. Products and sums are rounded one
// by one (__fmul_rn/__fadd_rn: no contraction), in the reference's order.
#include "kernels/cuda_common.cuh"
#include "kernels/rotary_cuda.h"

namespace tessera::kernels::detail {
namespace {

template <typename T, int V>
__global__ void ropeKernel(const RopeArgs a) {
  const T* in = static_cast<const T*>(a.in);  // may be out (in place)
  T* out = static_cast<T*>(a.out);
  const int half = a.headDim / 2;
  const long long itemsPerHead = half / V;
  const long long pairs = a.heads * itemsPerHead;
  const long long tail = a.inverse ? a.width - static_cast<long long>(a.heads) * a.headDim : 0;
  const long long perRow = pairs + tail;
  const long long total = a.tokens * a.batch * perRow;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long row = idx / perRow, rem = idx - row * perRow;
    const long long base = row * a.width;
    if (rem >= pairs) {  // backward only: v's gradient passes through
      const long long col = static_cast<long long>(a.heads) * a.headDim + (rem - pairs);
      out[base + col] = in[base + col];
      continue;
    }
    const long long head = rem / itemsPerHead;
    const int i = static_cast<int>(rem - head * itemsPerHead) * V;
    const long long t = row / a.batch;
    const long long at = base + head * a.headDim + i;
    float x0[V], x1[V], c[V], s[V], y0[V], y1[V];
    loadFloats<T, V>(in + at, x0);
    loadFloats<T, V>(in + at + half, x1);
    loadFloats<float, V>(a.cos + t * a.headDim + i, c);
    loadFloats<float, V>(a.sin + t * a.headDim + i, s);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (!a.inverse) {
        y0[k] = __fadd_rn(__fmul_rn(x0[k], c[k]), __fmul_rn(-x1[k], s[k]));
        y1[k] = __fadd_rn(__fmul_rn(x1[k], c[k]), __fmul_rn(x0[k], s[k]));
      } else {
        y0[k] = __fadd_rn(__fmul_rn(x0[k], c[k]), __fmul_rn(x1[k], s[k]));
        y1[k] = __fadd_rn(__fmul_rn(x1[k], c[k]), __fmul_rn(-x0[k], s[k]));
      }
    }
    storeFloats<T, V>(out + at, y0);
    storeFloats<T, V>(out + at + half, y1);
  }
}

}  // namespace

std::string launchRope(const RopeArgs& a, const Launch& l) {
  if (a.tokens <= 0 || a.batch <= 0 || a.width <= 0) return "";
  nccl_detail::DeviceGuard guard(l.device);
  const int v = a.vec2 ? 2 : 1;
  const long long tail = a.inverse ? a.width - static_cast<long long>(a.heads) * a.headDim : 0;
  const long long total = a.tokens * a.batch * (a.heads * static_cast<long long>(a.headDim / 2 / v) + tail);
  if (total <= 0) return "";
  const int threads = 256;
  const long long cap = static_cast<long long>(smCount(l.device)) * 16;
  long long blocks = (total + threads - 1) / threads;
  if (blocks > cap) blocks = cap;
  auto s = static_cast<cudaStream_t>(l.stream);
  TESSERA_DISPATCH_ELEM(a.type, T, {
    if (a.vec2) ropeKernel<T, 2><<<static_cast<unsigned>(blocks), threads, 0, s>>>(a);
    else ropeKernel<T, 1><<<static_cast<unsigned>(blocks), threads, 0, s>>>(a);
  });
  return lastLaunchError("ropeKernel");
}

}  // namespace tessera::kernels::detail
