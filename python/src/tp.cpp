// tessera._C.tp: tensor-parallel autograd ops (src/parallel/tensor/). Each returns a tensor
// whose grad_fn is a C++ autograd node, so backward's communication is C++ too. Forward is
// collective over the group (GIL released); backward runs in autograd's engine.
#include <pybind11/stl.h>

#include "bindings.h"
#include "tessera/parallel/tensor/linear.h"
#include "tessera/parallel/tensor/mappings.h"
#include "tessera/parallel/tensor/vocab.h"

namespace tessera::py {
namespace {

using Mapping = at::Tensor (*)(const at::Tensor&, const CommPtr&);

void defMapping(pb::module_& m, const char* name, Mapping f, const char* doc) {
  m.def(
      name,
      [f](const at::Tensor& x, const CommPtr& group) {
        pb::gil_scoped_release nogil;
        return f(x, group);
      },
      pb::arg("input"), pb::arg("group"), doc);
}

tp::ParallelLinearOptions linearOptions(bool gatherOutput, bool inputIsParallel, bool sequenceParallel,
                                        const std::string& name) {
  tp::ParallelLinearOptions o;
  o.gatherOutput = gatherOutput;
  o.inputIsParallel = inputIsParallel;
  o.sequenceParallel = sequenceParallel;
  o.name = name;
  o.overlap = tp::LinearOverlap::fromSettings(settings());  // the environment, as tessera.init() read it
  return o;
}

}  // namespace

void bindTp(pb::module_& parent) {
  auto m = parent.def_submodule("tp", "Tensor-parallel autograd ops (see src/parallel/tensor/*.h)");
  defMapping(m, "copy_to_region", &tp::copyToRegion, "f: fwd identity / bwd all-reduce(sum)");
  defMapping(m, "reduce_from_region", &tp::reduceFromRegion, "g: fwd all-reduce(sum) / bwd identity");
  defMapping(m, "gather_last_dim", &tp::gatherLastDim, "fwd all-gather last dim / bwd keep own split");
  defMapping(m, "split_last_dim", &tp::splitLastDim, "fwd keep own split of the last dim / bwd all-gather");
  defMapping(m, "gather_seq", &tp::gatherSeq, "fwd all-gather dim 0 / bwd reduce-scatter dim 0");
  defMapping(m, "reduce_scatter_seq", &tp::reduceScatterSeq, "fwd reduce-scatter dim 0 / bwd all-gather dim 0");

  m.def(
      "column_parallel_linear",
      [](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, const CommPtr& group,
         bool gatherOutput, bool sequenceParallel, const std::string& name) {
        auto o = linearOptions(gatherOutput, true, sequenceParallel, name);
        pb::gil_scoped_release nogil;
        return tp::columnParallelLinear(x, w, b.value_or(at::Tensor()), group, o);
      },
      pb::arg("input"), pb::arg("weight"), pb::arg("bias"), pb::arg("group"), pb::arg("gather_output") = false,
      pb::arg("sequence_parallel") = false, pb::arg("name") = "linear",
      "y = x W^T + b, W [out/tp, in] this rank's rows (see linear.h)");
  m.def(
      "row_parallel_linear",
      [](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, const CommPtr& group,
         bool inputIsParallel, bool sequenceParallel, const std::string& name) {
        auto o = linearOptions(false, inputIsParallel, sequenceParallel, name);
        pb::gil_scoped_release nogil;
        return tp::rowParallelLinear(x, w, b.value_or(at::Tensor()), group, o);
      },
      pb::arg("input"), pb::arg("weight"), pb::arg("bias"), pb::arg("group"), pb::arg("input_is_parallel") = true,
      pb::arg("sequence_parallel") = false, pb::arg("name") = "linear",
      "y = x W^T + b, W [out, in/tp] this rank's columns (see linear.h)");
  m.def(
      "vocab_parallel_embedding",
      [](const at::Tensor& ids, const at::Tensor& w, const CommPtr& group, int64_t vocab) {
        pb::gil_scoped_release nogil;
        return tp::vocabParallelEmbedding(ids, w, group, vocab);
      },
      pb::arg("ids"), pb::arg("weight"), pb::arg("group"), pb::arg("vocab"));
  m.def(
      "vocab_parallel_cross_entropy",
      [](const at::Tensor& logits, const at::Tensor& targets, const CommPtr& group, int64_t vocab) {
        pb::gil_scoped_release nogil;
        return tp::vocabParallelCrossEntropy(logits, targets, group, vocab);
      },
      pb::arg("logits_shard"), pb::arg("targets"), pb::arg("group"), pb::arg("vocab") = 0);
  m.def(
      "vocab_range",
      [](int64_t vocab, int rank, int size) {
        auto r = tp::vocabRange(vocab, rank, size, "vocab_range");
        return pb::make_tuple(r.start, r.end);
      },
      pb::arg("vocab"), pb::arg("rank"), pb::arg("size"));
}

}  // namespace tessera::py
