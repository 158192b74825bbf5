// cuBLAS GEMM with fp32 accumulation into a float32 buffer (see gemm_accumulate_cuda.h).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>
#include <unordered_map>

#include "kernels/gemm_accumulate_cuda.h"

namespace tessera::kernels::detail {
namespace {

std::string cublasError(const char* call, cublasStatus_t s) {
  return std::string(call) + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")";
}

// One handle per (thread, device): cuBLAS handles are not meant to be shared across threads that
// set different streams. Never destroyed: a thread-local destructor could run after the CUDA
// context is gone (at process exit).
cublasStatus_t handleFor(int device, cublasHandle_t* out) {
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) {
    *out = it->second;
    return CUBLAS_STATUS_SUCCESS;
  }
  cublasHandle_t h = nullptr;
  const cublasStatus_t s = cublasCreate(&h);
  if (s == CUBLAS_STATUS_SUCCESS) handles.emplace(device, h);
  *out = h;
  return s;
}

}  // namespace

std::string launchGemmAccumulateTN(float* acc, const void* a, const void* b, GemmInput type, long long m, long long n,
                                   long long k, bool overwrite, void* stream, int device) {
  if (m <= 0 || n <= 0) return "";
  int prev = -1;
  cudaError_t err = cudaGetDevice(&prev);
  if (err == cudaSuccess && prev != device) err = cudaSetDevice(device);
  if (err != cudaSuccess) return std::string("cudaSetDevice: ") + cudaGetErrorString(err);
  std::string msg;
  if (k == 0) {  // an empty sum: acc unchanged, or zero when overwriting
    if (overwrite) {
      err = cudaMemsetAsync(acc, 0, static_cast<size_t>(m * n) * sizeof(float), static_cast<cudaStream_t>(stream));
      if (err != cudaSuccess) msg = std::string("cudaMemsetAsync: ") + cudaGetErrorString(err);
    }
  } else {
    cublasHandle_t h = nullptr;
    cublasStatus_t s = handleFor(device, &h);
    if (s != CUBLAS_STATUS_SUCCESS) {
      msg = cublasError("cublasCreate", s);
    } else if ((s = cublasSetStream(h, static_cast<cudaStream_t>(stream))) != CUBLAS_STATUS_SUCCESS) {
      msg = cublasError("cublasSetStream", s);
    } else {
      const cudaDataType_t t = type == GemmInput::BFloat16 ? CUDA_R_16BF : type == GemmInput::Float16 ? CUDA_R_16F
                                                                                                      : CUDA_R_32F;
      const float alpha = 1.0f, beta = overwrite ? 0.0f : 1.0f;
      // Row-major acc[m, n] is column-major accᵀ [n, m] (ld n) = bᵀ a with b column-major [n, k]
      // (ld n) and a column-major [m, k] (ld m): op(A) = A = b, op(B) = aᵀ.
      s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                       &alpha, b, t, static_cast<int>(n), a, t, static_cast<int>(m), &beta, acc, CUDA_R_32F,
                       static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (s != CUBLAS_STATUS_SUCCESS) msg = cublasError("cublasGemmEx", s);
    }
  }
  if (prev >= 0 && prev != device) cudaSetDevice(prev);
  return msg;
}

}  // namespace tessera::kernels::detail
