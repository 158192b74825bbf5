#include "tessera/parallel/tensor/mappings.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fmt/ranges.h>

#include "comm/autograd_comm.h"
#include "tessera/common/error.h"

namespace tessera::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The communicator rides in the autograd context (no global topology).
void saveComm(AutogradContext* ctx, const CommPtr& c) { autograd_comm::save(ctx, c); }
CommPtr loadComm(AutogradContext* ctx) { return autograd_comm::load(ctx); }

at::Tensor allReduce(const at::Tensor& x, const CommPtr& c) {
  auto out = x.contiguous().clone();
  c->allReduce(out)->wait();
  return out;
}

// [..., k] on every rank → [..., n*k] with rank r's block at [r*k, (r+1)*k).
at::Tensor gatherLast(const at::Tensor& x, const CommPtr& c) {
  auto in = x.contiguous();
  auto buf = at::empty({c->size() * in.numel()}, in.options());
  c->allGather(buf, in)->wait();
  std::vector<int64_t> shape{c->size()};
  for (auto s : in.sizes()) shape.push_back(s);
  auto sizes = in.sizes().vec();
  sizes.back() *= c->size();
  return buf.view(shape).movedim(0, -2).reshape(sizes);
}

// Throws naming the op when dimension `dim` of x does not split evenly over the group.
void checkDivisible(const at::Tensor& x, int64_t dim, const CommPtr& c, const char* op) {
  TESSERA_CHECK(x.dim() >= 1 && x.size(dim) % c->size() == 0,
                "tp::{}: dimension {} (size {}) of a [{}] tensor is not divisible by the tensor-parallel size {} "
                "(rank {})",
                op, dim, x.dim() ? x.size(dim) : 0, fmt::join(x.sizes(), ", "), c->size(), c->rank());
}

// A 0-D tensor has no dimension to gather (the gathers would index an empty shape).
void checkHasDim(const at::Tensor& x, const char* op) {
  TESSERA_CHECK(x.defined() && x.dim() >= 1, "tp::{}: needs a tensor of at least one dimension, got a {}", op,
                x.defined() ? "0-D tensor" : "undefined tensor");
}

at::Tensor splitLast(const at::Tensor& x, const CommPtr& c, const char* op) {
  checkDivisible(x, -1, c, op);
  return x.chunk(c->size(), -1)[c->rank()].contiguous();
}

at::Tensor gatherFirst(const at::Tensor& x, const CommPtr& c) {
  auto in = x.contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] *= c->size();
  auto out = at::empty(sizes, in.options());
  c->allGather(out, in)->wait();
  return out;
}

at::Tensor reduceScatterFirst(const at::Tensor& x, const CommPtr& c, const char* op) {
  checkDivisible(x, 0, c, op);
  auto in = x.contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] /= c->size();
  auto out = at::empty(sizes, in.options());
  c->reduceScatter(out, in)->wait();
  return out;
}

// One autograd Function per pair: Fwd / Bwd are the two directions.
template <typename Fwd, typename Bwd>
struct Mapping : torch::autograd::Function<Mapping<Fwd, Bwd>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, CommPtr comm) {
    saveComm(ctx, comm);
    return Fwd::run(x, comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {Bwd::run(grads[0], loadComm(ctx)), at::Tensor()};
  }
};

struct Identity {
  static at::Tensor run(const at::Tensor& x, const CommPtr&) { return x; }
};
struct AllReduce {
  static at::Tensor run(const at::Tensor& x, const CommPtr& c) { return allReduce(x, c); }
};
struct GatherLast {
  static at::Tensor run(const at::Tensor& x, const CommPtr& c) { return gatherLast(x, c); }
};
struct SplitLast {
  static at::Tensor run(const at::Tensor& x, const CommPtr& c) { return splitLast(x, c, "split_last_dim"); }
};
struct SplitFirst {
  static at::Tensor run(const at::Tensor& x, const CommPtr& c) {
    checkDivisible(x, 0, c, "scatter_seq");
    return x.chunk(c->size(), 0)[c->rank()].contiguous();
  }
};
struct GatherFirst {
  static at::Tensor run(const at::Tensor& x, const CommPtr& c) { return gatherFirst(x, c); }
};
struct ReduceScatterFirst {
  static at::Tensor run(const at::Tensor& x, const CommPtr& c) { return reduceScatterFirst(x, c, "reduce_scatter_seq"); }
};

template <typename M>
at::Tensor apply(const at::Tensor& x, const CommPtr& tp, const char* op) {
  TESSERA_CHECK(tp, "tp::{}: no tensor-parallel communicator given", op);
  if (tp->size() == 1) return x;  // a group of one: no communication, no autograd node
  return M::apply(x, tp);
}

}  // namespace

at::Tensor copyToRegion(const at::Tensor& x, const CommPtr& tp) {
  return apply<Mapping<Identity, AllReduce>>(x, tp, "copy_to_region");
}
at::Tensor reduceFromRegion(const at::Tensor& x, const CommPtr& tp) {
  return apply<Mapping<AllReduce, Identity>>(x, tp, "reduce_from_region");
}
at::Tensor gatherLastDim(const at::Tensor& x, const CommPtr& tp) {
  checkHasDim(x, "gather_last_dim");  // also for a group of one
  return apply<Mapping<GatherLast, SplitLast>>(x, tp, "gather_last_dim");
}
at::Tensor splitLastDim(const at::Tensor& x, const CommPtr& tp) {
  if (tp) checkDivisible(x, -1, tp, "split_last_dim");  // also for a group of one
  return apply<Mapping<SplitLast, GatherLast>>(x, tp, "split_last_dim");
}
at::Tensor gatherSeq(const at::Tensor& x, const CommPtr& tp) {
  checkHasDim(x, "gather_seq");  // also for a group of one
  return apply<Mapping<GatherFirst, ReduceScatterFirst>>(x, tp, "gather_seq");
}
at::Tensor reduceScatterSeq(const at::Tensor& x, const CommPtr& tp) {
  if (tp) checkDivisible(x, 0, tp, "reduce_scatter_seq");
  return apply<Mapping<ReduceScatterFirst, GatherFirst>>(x, tp, "reduce_scatter_seq");
}

at::Tensor scatterSeq(const at::Tensor& x, const CommPtr& tp) {
  if (tp) checkDivisible(x, 0, tp, "scatter_seq");
  return apply<Mapping<SplitFirst, GatherFirst>>(x, tp, "scatter_seq");
}

}  // namespace tessera::tp
