#pragma once
// Internal (kernels/ only): the launcher of the multi-tensor copy kernel in bucket_copy_cuda.cu.
// No torch and no CUDA type appears here, so bucket_copy.cpp compiles without either.
#include <string>

namespace tessera::kernels::detail {

// Element types the kernel reads and writes.
enum class CopyDtype : int { F32 = 0, BF16 = 1, F16 = 2 };

// One tensor's copy: dst[k] = cast<dstType>(float(src[k]) * scale) for k in [0, numel).
// src and dst are device pointers aligned to their element size; src may equal dst (in-place
// scaling of a same-dtype view); any other overlap, and overlap between items, is undefined.
struct CopyItem {
  const void* src;
  void* dst;
  long long numel;
  CopyDtype srcType;
  CopyDtype dstType;
};

// Local, asynchronous: enqueues the copies of items[0..count) on `stream` (a cudaStream_t of
// `device`, passed as void*), at most kMaxItemsPerLaunch items per kernel launch. `scale` is
// applied in fp32 unless it is exactly 1. Makes `device` current for the launches and restores
// the previous device. Returns "" on success, else the CUDA error text of the failed launch
// (the caller throws). Items with numel 0 are skipped.
std::string launchMultiTensorCopy(const CopyItem* items, int count, float scale, void* stream, int device);

constexpr int kMaxItemsPerLaunch = 48;

}  // namespace tessera::kernels::detail
