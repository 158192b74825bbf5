#pragma once
// Internal (kernels/ only): the cuBLAS call behind kernels::gemmAccumulateTN (gemm_accumulate.h).
// No torch and no CUDA type appears here, so gemm_accumulate.cpp compiles without either.
#include <string>

namespace tessera::kernels::detail {

enum class GemmInput { Float32, BFloat16, Float16 };

// Column-major view of the row-major problem acc[m, n] (+)= a[k, m]ᵀ b[k, n]: one cublasGemmEx
// on `stream` (a cudaStream_t of `device`, as void*) with the thread's cuBLAS handle for
// `device` (created on first use, kept for the thread's life). beta = 0 with `overwrite`, else 1.
// Makes `device` current for the call and restores the previous one. Returns "" or the error.
std::string launchGemmAccumulateTN(float* acc, const void* a, const void* b, GemmInput type, long long m, long long n,
                                   long long k, bool overwrite, void* stream, int device);

}  // namespace tessera::kernels::detail
