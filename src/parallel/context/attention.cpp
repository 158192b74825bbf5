// Context-parallel attention by gathered K and V (contract in attention.h).
#include "tessera/parallel/context/attention.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <optional>

#include "tessera/common/attention.h"
#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "tessera/parallel/context/chunks.h"
#include "tessera/parallel/tensor/mappings.h"

// The fused kernels' ATen entry points with the signatures used below (optional tensors,
// SymInt max lengths, bottom-right causal for the flash op) date from LibTorch 2.5.
#if (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)) && \
    defined(TESSERA_TORCH_CUDA)
#define TESSERA_CP_FUSED 1
#endif

namespace tessera::cp {
namespace {
// [S, B, H, D] → [B, H·rep, S, D], each head repeated rep times (grouped-query attention).
at::Tensor headsFirst(const at::Tensor& x, int64_t rep) { return repeatKvHeads(x.permute({1, 2, 0, 3}), rep); }

// The math path for one chunk: q [c, B, Hq, D] at global positions first.., k and v
// [keys, B, Hkv, D] (positions 0..keys-1). Returns [c, B, Hq, D].
at::Tensor mathChunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t first) {
  const int64_t keys = k.size(0), rep = q.size(2) / k.size(2);
  auto qc = q.permute({1, 2, 0, 3});  // [B, Hq, c, D]
  // Query i (global first + i) sees keys j <= first + i.
  auto allowed = at::arange(keys, q.options().dtype(at::kLong)).unsqueeze(0) <=
                 at::arange(first, first + q.size(0), q.options().dtype(at::kLong)).unsqueeze(1);
  return maskedSelfAttention(qc, headsFirst(k, rep), headsFirst(v, rep), allowed).permute({2, 0, 1, 3});
}

#ifdef TESSERA_CP_FUSED
// [S, B, H, D] → [B, S, H, D] (the fused kernels' layout; a view, last dimension contiguous).
at::Tensor bshd(const at::Tensor& x) { return x.permute({1, 0, 2, 3}); }

// FlashAttention-2: causal is bottom-right aligned when c < keys; kv heads dividing q heads are
// read in place. Output [B, c, Hq, D] → [c, B, Hq, D].
at::Tensor flashChunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  auto out = at::_flash_attention_forward(bshd(q), bshd(k), bshd(v), /*cum_seq_q=*/std::nullopt,
                                          /*cum_seq_k=*/std::nullopt, /*max_q=*/q.size(0), /*max_k=*/k.size(0),
                                          /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false);
  return std::get<0>(out).permute({1, 0, 2, 3});
}

// The memory-efficient kernel with CausalFromBottomRight (custom_mask_type 2); it wants as many
// kv heads as q heads. compute_log_sumexp: its backward needs the log-sum-exp.
at::Tensor efficientChunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t rep = q.size(2) / k.size(2);
  auto expand = [rep](const at::Tensor& x) {  // [S, B, Hkv, D] → [B, S, Hkv·rep, D]
    auto y = bshd(x);
    if (rep == 1) return y;
    const int64_t b = y.size(0), s = y.size(1), h = y.size(2), d = y.size(3);
    return y.unsqueeze(3).expand({b, s, h, rep, d}).reshape({b, s, h * rep, d});
  };
  constexpr int64_t kCausalFromBottomRight = 2;
  auto out = at::_efficient_attention_forward(bshd(q), expand(k), expand(v), /*bias=*/std::nullopt,
                                              /*cu_seqlens_q=*/std::nullopt, /*cu_seqlens_k=*/std::nullopt,
                                              /*max_seqlen_q=*/std::nullopt, /*max_seqlen_k=*/std::nullopt,
                                              /*dropout_p=*/0.0, kCausalFromBottomRight, /*compute_log_sumexp=*/true);
  return std::get<0>(out).permute({1, 0, 2, 3});
}
#endif

bool flashFits(const at::Tensor& q) {
  const auto dt = q.scalar_type();
  return q.is_cuda() && (dt == at::kBFloat16 || dt == at::kHalf) && q.size(3) <= 256 && q.size(3) % 8 == 0;
}
bool efficientFits(const at::Tensor& q) {
  const auto dt = q.scalar_type();
  return q.is_cuda() && (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf) && q.size(3) % 8 == 0;
}

// The kernel `asked` resolves to for these inputs; an impossible request is an Error.
Kernel resolve(Kernel asked, const at::Tensor& q, int rank, int size) {
  const bool fused = fusedKernelsBuilt();
  if (asked == Kernel::Auto) {
    if (fused && flashFits(q)) return Kernel::Flash;
    if (fused && efficientFits(q)) return Kernel::Efficient;
    return Kernel::Math;
  }
  if (asked == Kernel::Math) return asked;
  TESSERA_CHECK(fused,
                "context-parallel attention (rank {} of cp {}): kernel {} asked for, but this build has no fused "
                "CUDA attention (needs a CUDA LibTorch >= 2.5)",
                rank, size, kernelName(asked));
  TESSERA_CHECK(asked == Kernel::Flash ? flashFits(q) : efficientFits(q),
                "context-parallel attention (rank {} of cp {}): kernel {} does not take q {} of {} on {} (flash: CUDA, "
                "bf16/fp16, head dim <= 256 and a multiple of 8; efficient: CUDA, fp32/bf16/fp16, head dim a "
                "multiple of 8)",
                rank, size, kernelName(asked), c10::str(q.sizes()), c10::toString(q.scalar_type()), q.device().str());
  return asked;
}
}  // namespace

bool fusedKernelsBuilt() {
#ifdef TESSERA_CP_FUSED
  return true;
#else
  return false;
#endif
}

const char* kernelName(Kernel kernel) {
  switch (kernel) {
    case Kernel::Auto: return "auto";
    case Kernel::Flash: return "flash";
    case Kernel::Efficient: return "efficient";
    case Kernel::Math: return "math";
  }
  return "?";
}

at::Tensor attention(const at::Tensor& qIn, const at::Tensor& kIn, const at::Tensor& vIn, const CommPtr& group,
                     Kernel kernel) {
  TESSERA_CHECK(group, "context-parallel attention: no cp communicator given");
  // Under CUDA autocast in its dtype, as scaled_dot_product_attention would run (and the fused kernels
  // want bf16/fp16); unchanged elsewhere. Undefined inputs pass through to the check below.
  auto cast = [](const at::Tensor& x) { return x.defined() ? castForCudaAutocast(x) : x; };
  const auto q = cast(qIn), k = cast(kIn), v = cast(vIn);
  TESSERA_CHECK(q.defined() && k.defined() && v.defined() && q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes() &&
                    q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3) && k.size(2) > 0 &&
                    q.size(2) % k.size(2) == 0,
                "context-parallel attention (rank {} of cp {}): needs q [T/cp, B, Hq, D] and k, v [T/cp, B, Hkv, D] "
                "with Hq a multiple of Hkv; got q {}, k {}, v {}",
                group->rank(), group->size(), q.defined() ? c10::str(q.sizes()) : "undefined",
                k.defined() ? c10::str(k.sizes()) : "undefined", v.defined() ? c10::str(v.sizes()) : "undefined");
  const int n = group->size(), r = group->rank();
  TESSERA_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() &&
                    q.device() == k.device() && k.device() == v.device(),
                "context-parallel attention (rank {} of cp {}): q, k, v differ in dtype or device: {} {}, {} {}, {} {}",
                r, n, c10::toString(q.scalar_type()), q.device().str(), c10::toString(k.scalar_type()),
                k.device().str(), c10::toString(v.scalar_type()), v.device().str());
  const int64_t local = q.size(0), T = local * n;
  TESSERA_CHECK(local % 2 == 0, "context-parallel attention (rank {} of cp {}): {} local positions are not two chunks",
                r, n, local);
  [[maybe_unused]] const Kernel use = resolve(kernel, q, r, n);
  const int64_t c = local / 2;
  // Every rank's k and v, reordered from rank order to global positions.
  const auto order = gatheredToGlobal(T, n).to(q.device());
  const auto kAll = tp::gatherSeq(k.contiguous(), group).index_select(0, order);
  const auto vAll = tp::gatherSeq(v.contiguous(), group).index_select(0, order);
  std::vector<at::Tensor> outs;
  const auto chunks = chunksOf(n, r);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int64_t first = chunks[i] * c, keys = first + c;  // this chunk's positions; the keys up to its end
    auto qc = q.narrow(0, static_cast<int64_t>(i) * c, c);
    if (qc.stride(3) != 1) qc = qc.contiguous();
    auto kc = kAll.narrow(0, 0, keys), vc = vAll.narrow(0, 0, keys);
#ifdef TESSERA_CP_FUSED
    if (use == Kernel::Flash) {
      outs.push_back(flashChunk(qc, kc, vc));
      continue;
    }
    if (use == Kernel::Efficient) {
      outs.push_back(efficientChunk(qc, kc, vc));
      continue;
    }
#endif
    outs.push_back(mathChunk(qc, kc, vc, first));
  }
  return at::cat(outs, 0);
}

}  // namespace tessera::cp
