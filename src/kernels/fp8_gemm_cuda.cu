// cuBLASLt's scaled FP8 GEMM (see fp8_cuda.h). Row-major D[m, n] = A[m, k] · B[n, k]ᵀ is, column-major,
// Dᵀ[n, m] = op(B')·op(A') with B' the column-major [k, n] view of B (transposed: "T") and A' the
// [k, m] view of A (not transposed: "N") — the TN layout cuBLASLt's FP8 kernels require.
#include <cublasLt.h>

#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "kernels/cuda_common.cuh"
#include "kernels/fp8_cuda.h"

namespace tessera::kernels::detail {
namespace {

std::string ltError(const char* call, cublasStatus_t s) {
  return std::string(call) + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")";
}

// One handle per (thread, device), never destroyed (as gemm_accumulate_cuda.cu's).
cublasStatus_t ltHandle(int device, cublasLtHandle_t* out) {
  thread_local std::unordered_map<int, cublasLtHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) {
    *out = it->second;
    return CUBLAS_STATUS_SUCCESS;
  }
  cublasLtHandle_t h = nullptr;
  const cublasStatus_t s = cublasLtCreate(&h);
  if (s == CUBLAS_STATUS_SUCCESS) handles.emplace(device, h);
  *out = h;
  return s;
}

// Descriptors destroyed on every path.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The heuristic's choice per problem, per device: asking costs more than the GEMM of a small one.
using AlgoKey = std::tuple<int, long long, long long, long long, long long, int, int, int, int, int, int>;
std::mutex gAlgoMutex;
std::map<AlgoKey, cublasLtMatmulAlgo_t> gAlgos;

cudaDataType_t outType(ElemType t) {
  return t == ElemType::F32 ? CUDA_R_32F : t == ElemType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

#define TESSERA_LT(call)                                   \
  do {                                                     \
    const cublasStatus_t s_ = (call);                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) return ltError(#call, s_); \
  } while (0)

}  // namespace

std::string launchFp8Gemm(const Fp8GemmArgs& g, const Launch& l) {
  if (g.m <= 0 || g.n <= 0) return "";
  if (g.aE5M2 && g.bE5M2) return "fp8 GEMM: cuBLASLt has no E5M2 × E5M2 kernel";
  nccl_detail::DeviceGuard guard(l.device);
  cublasLtHandle_t h = nullptr;
  TESSERA_LT(ltHandle(l.device, &h));
  Descs d;
  TESSERA_LT(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  TESSERA_LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
  TESSERA_LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
  // cuBLASLt's A is our B and its B our A (the comment at the top).
  const void* ltAScale = g.bScale;
  const void* ltBScale = g.aScale;
  TESSERA_LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ltAScale, sizeof(ltAScale)));
  TESSERA_LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ltBScale, sizeof(ltBScale)));
  if (g.outerScales) {
    const cublasLtMatmulMatrixScale_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    TESSERA_LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
    TESSERA_LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
  }
  const int8_t fast = g.fastAccum ? 1 : 0;
  TESSERA_LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  const cudaDataType_t aType = g.bE5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;  // cuBLASLt's A: our B
  const cudaDataType_t bType = g.aE5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
  TESSERA_LT(cublasLtMatrixLayoutCreate(&d.a, aType, g.k, g.n, g.k));
  TESSERA_LT(cublasLtMatrixLayoutCreate(&d.b, bType, g.k, g.m, g.k));
  TESSERA_LT(cublasLtMatrixLayoutCreate(&d.d, outType(g.dType), g.n, g.m, g.ldd));

  const AlgoKey key{l.device, g.m, g.n, g.k, g.ldd, static_cast<int>(g.dType), g.aE5M2, g.bE5M2, g.outerScales,
                    g.accumulate, g.fastAccum};
  cublasLtMatmulAlgo_t algo;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(gAlgoMutex);
    auto it = gAlgos.find(key);
    if (it != gAlgos.end()) algo = it->second, known = true;
  }
  if (!known) {
    TESSERA_LT(cublasLtMatmulPreferenceCreate(&d.pref));
    const size_t ws = g.workspaceBytes;
    TESSERA_LT(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result;
    std::memset(&result, 0, sizeof(result));
    int found = 0;
    TESSERA_LT(cublasLtMatmulAlgoGetHeuristic(h, d.op, d.a, d.b, d.d, d.d, d.pref, 1, &result, &found));
    if (found == 0)
      return "fp8 GEMM: cuBLASLt has no algorithm for m " + std::to_string(g.m) + ", n " + std::to_string(g.n) +
             ", k " + std::to_string(g.k) + (g.outerScales ? " with row/column scales" : "");
    algo = result.algo;
    std::lock_guard<std::mutex> lock(gAlgoMutex);
    gAlgos.emplace(key, algo);
  }
  const float alpha = 1.f, beta = g.accumulate ? 1.f : 0.f;
  TESSERA_LT(cublasLtMatmul(h, d.op, &alpha, g.b, d.a, g.a, d.b, &beta, g.d, d.d, g.d, d.d, &algo, g.workspace,
                            g.workspaceBytes, static_cast<cudaStream_t>(l.stream)));
  return "";
}

}  // namespace tessera::kernels::detail
