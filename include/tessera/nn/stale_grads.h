#pragma once
// Stale gradients: a zero_grad without the zeroing pass (DdpOptions::overwriteStaleGrads). A
// parameter marked stale has a .grad of garbage, to be replaced by the step's first writer:
// - the float32 weight-gradient GEMMs (accum_linear.h) write with beta = 0 (takeStale);
// - writers that add (the embedding's rows; autograd's AccumulateGrad, through a hook on the
//   parameter that DDP installs) zero it first (zeroIfStale);
// - whoever ends the backward (DDP's hooks, its end of backward, reduceGradients) zeroes the rest.
// Each mark is resolved exactly once, by one of these; until then .grad must not be read.
// Process-wide (one registry for autograd's device threads), thread-safe, local. An entry is keyed
// by the parameter's TensorImpl and holds the parameter until resolved or cleared. Zeroing runs on
// the calling thread's current stream. Why: docs/design/nn.md.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace tessera::nn {

// Marks the parameters whose .grad is defined (the others are created by their first writer
// anyway). Marking a stale parameter again keeps one mark.
void markStale(const std::vector<at::Tensor>& params);
// True when `param` was stale: the mark is removed and the caller must now overwrite every
// element of .grad (and .grad is defined).
bool takeStale(const at::Tensor& param);
// Resolves a mark by zeroing .grad in place; nothing for a parameter that is not stale.
void zeroIfStale(const at::Tensor& param);
void zeroIfStale(const c10::TensorImpl* param);
// zeroIfStale for each, the zeroing in one multi-tensor launch where LibTorch has it.
void zeroIfStale(const std::vector<at::Tensor>& params);
// The plain zero_grad: every defined .grad zeroed in place (bucket views kept), in one launch
// as above; marks on these parameters are resolved by it.
void zeroGrads(const std::vector<at::Tensor>& params);
bool isStale(const at::Tensor& param);
size_t staleCount();  // marks not yet resolved (tests)

}  // namespace tessera::nn
