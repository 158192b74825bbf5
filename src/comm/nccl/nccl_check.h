#pragma once
// Check macros for the two foreign APIs of the NCCL backend. Internal header (nccl/*.cpp only).
// Each names the call as written, file:line, the rank and the library's error string, and
// throws tessera::CommError (NCCL) or tessera::Error (CUDA).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "tessera/common/error.h"

namespace tessera::nccl_detail {

inline std::string ncclMessage(const char* call, const char* file, int line, int rank, ncclResult_t r,
                               ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return fmt::format("tessera: NCCL call {} failed at {}:{} on rank {}: {} (ncclResult {}){}{}", call, file, line,
                     rank, ncclGetErrorString(r), static_cast<int>(r), (last && *last) ? ": " : "",
                     last ? last : "");
}

inline std::string cudaMessage(const char* call, const char* file, int line, int rank, cudaError_t e) {
  return fmt::format("tessera: CUDA call {} failed at {}:{} on rank {}: {} ({})", call, file, line, rank,
                     cudaGetErrorName(e), cudaGetErrorString(e));
}

}  // namespace tessera::nccl_detail

// TESSERA_NCCL_CHECK(call, rank, comm): evaluates to the ncclResult_t; ncclSuccess and
// ncclInProgress (non-blocking communicators) pass, anything else throws CommError.
// `comm` (may be nullptr) is asked for NCCL's last error text.
#define TESSERA_NCCL_CHECK(call, rank, comm)                                                            \
  ([&]() -> ncclResult_t {                                                                              \
    ncclResult_t tessera_r_ = (call);                                                                   \
    if (tessera_r_ != ncclSuccess && tessera_r_ != ncclInProgress)                                      \
      throw ::tessera::CommError(                                                                       \
          ::tessera::nccl_detail::ncclMessage(#call, __FILE__, __LINE__, (rank), tessera_r_, (comm)));  \
    return tessera_r_;                                                                                  \
  }())

// TESSERA_CUDA_CHECK(call, rank): throws tessera::Error unless the call returns cudaSuccess.
#define TESSERA_CUDA_CHECK(call, rank)                                                                  \
  do {                                                                                                  \
    cudaError_t tessera_e_ = (call);                                                                    \
    if (tessera_e_ != cudaSuccess) {                                                                    \
      (void)cudaGetLastError(); /* clear a sticky-free error so the next call starts clean */          \
      throw ::tessera::Error(::tessera::nccl_detail::cudaMessage(#call, __FILE__, __LINE__, (rank), tessera_e_)); \
    }                                                                                                   \
  } while (0)
