#pragma once
// Vocab-parallel layers (Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy):
// the vocabulary is split evenly over the tensor-parallel group `tp`; rank r owns vocab rows
// [r*V/tp, (r+1)*V/tp). A vocab size not divisible by the group size is a tessera::Error
// naming the layer and both numbers.
//
// Both are collective over `tp` in forward: every rank of the group calls them in the same
// order with the same ids/targets (and the same N). A group of one communicates nothing.
// Tensors live on the group's device (CPU for Gloo, the communicator's GPU for NCCL);
// collectives are ordered for the caller with Work::wait() (blocks on CPU, stream-orders on CUDA).
// Global range checks of ids/targets (0 <= id < V) are done on CPU tensors only: on CUDA they
// would cost a host synchronisation; there an id no rank owns yields a zero row / a zero
// target logit, as in Megatron-LM.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

#include "tessera/comm/communicator.h"

namespace tessera::tp {

// Rows [start, end) of a vocab of `vocab` rows owned by rank `rank` of `size` ranks.
// Throws tessera::Error naming `layer`, `vocab` and `size` when vocab % size != 0.
struct VocabRange {
  int64_t start = 0, end = 0;
  int64_t size() const { return end - start; }
};
VocabRange vocabRange(int64_t vocab, int rank, int size, const std::string& layer);

// An embedding table of `vocab` rows split by rows over `tp`. Parameter "weight": this rank's
// shard [vocab/tp, dim]. forward(ids): ids of any shape (int64 or int32), any value in
// [0, vocab); the output [*ids.shape, dim] equals torch::embedding(fullWeight, ids) on every
// rank. Ids outside this rank's rows are looked up as row 0 and their output rows zeroed, then
// the partial outputs are summed over `tp` with reduceFromRegion ("g": fwd all-reduce(sum) /
// bwd identity), so the weight gradient is local: this rank's shard of the full gradient.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  // Weight = this rank's shard of fullInitWeight(vocab, dim, seed) (the same full weight on
  // every rank, so TP=k and TP=1 start from identical weights), converted to `options`.
  // Local (no communication).
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, CommPtr tp, uint64_t seed = 0,
                             at::TensorOptions options = {});
  // Weight = this rank's shard of `fullWeight` [vocab, dim] (copied, same dtype/device).
  VocabParallelEmbeddingImpl(const at::Tensor& fullWeight, CommPtr tp);

  // Collective over tp (see above).
  at::Tensor forward(const at::Tensor& ids);

  // Local: overwrite this rank's shard with its rows of `fullWeight` [vocab, dim]; throws
  // naming the layer and the shapes when the shape differs.
  void loadFull(const at::Tensor& fullWeight);

  // The full initial weight the seed gives: N(0, 1) like torch::nn::Embedding, drawn on the CPU
  // with a generator seeded `seed` (independent of the global RNG), float32 [vocab, dim].
  static at::Tensor fullInitWeight(int64_t vocab, int64_t dim, uint64_t seed);

  int64_t vocab() const { return vocab_; }
  int64_t dim() const { return dim_; }
  VocabRange range() const { return range_; }
  const CommPtr& group() const { return tp_; }

  at::Tensor weight;  // [vocab/tp, dim], registered as "weight"
  // The weight gradient summed straight into weight.grad, row by row in float32
  // (nn/accum_embedding.h), instead of a dense [vocab/tp, dim] gradient per micro-batch that
  // autograd then adds: set with the linears by tp::setAccumulateGradInGemm.
  bool accumulateGrad = false;
  // With accumulateGrad: the lookup keeps no autograd edge to the weight (nn/accum_embedding.h's
  // untracked lookup), for a table whose tied head gives it one; its rows go to the weight's
  // row-gradient sink (DDP's gatherEmbeddingRows), which must exist.
  bool untracked = false;

 private:
  void setup(int64_t vocab, int64_t dim, const at::Tensor& shard);

  CommPtr tp_;
  int64_t vocab_ = 0, dim_ = 0;
  VocabRange range_;
};
TORCH_MODULE(VocabParallelEmbedding);

// Functional form of VocabParallelEmbedding's forward (what the Python extension's module
// calls): `weightShard` [vocab/tp, dim] holds rows vocabRange(vocab, tp rank, tp size). Same
// collectives, autograd and errors as forward(); `accumulateGrad` and `untracked` as the module's.
// Collective over tp.
at::Tensor vocabParallelEmbedding(const at::Tensor& ids, const at::Tensor& weightShard, const CommPtr& tp,
                                  int64_t vocab, bool accumulateGrad = false, bool untracked = false);

// Mean cross-entropy over N rows whose logits are split over `tp` by the vocab dimension:
// `logitsShard` [N, V/tp] (float32/bf16/fp16; computed in float32) holds this rank's columns
// [r*V/tp, (r+1)*V/tp); `targets` [N] int64, global ids in [0, V). Returns a float32 scalar equal
// to torch's cross_entropy(fullLogits, targets) (mean reduction) on every rank; the full logits
// are never gathered.
// fwd: collective over tp, two all-reduces: max(row max); sum(target logit, sum of exp) in one
//      buffer. bwd: local, no communication: (softmax shard − one-hot(target ∈ this shard)) · g / N.
// Saves the softmax shard [N, V/tp] (float32) for backward. Errors (tessera::Error) name the op
// and the numbers: non-2-D logits, targets not [N] int64, N == 0, device mismatch,
// tp size × shard width inconsistent with `vocab` when `vocab` > 0 is given.
// fused: the same loss and gradient from tessera's kernels (kernels/cross_entropy.h: the CPU
// references on CPU): this shard's row max, sum of exp (relative to it) and target logit in one
// read of the logits, combined after the same two all-reduces (max, then sum); it saves the
// logits shard itself (its dtype: no float32 copy) and backward writes the gradient in one pass.
// gradInLogits (fused only): backward writes the gradient over the saved logits shard (when it is
// contiguous, it is the caller's tensor): no second [N, V/tp] buffer at the peak of memory, for a
// caller whose logits are dead after the loss; the loss can then be backpropagated once.
at::Tensor vocabParallelCrossEntropy(const at::Tensor& logitsShard, const at::Tensor& targets,
                                     const CommPtr& tp, int64_t vocab = 0, bool fused = false,
                                     bool gradInLogits = false);

}  // namespace tessera::tp
