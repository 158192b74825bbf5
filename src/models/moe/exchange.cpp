#include "models/moe/exchange.h"

#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>

#include "comm/autograd_comm.h"
#include "tessera/common/error.h"

namespace tessera::models::moe_detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The transfer itself: this rank's own block is copied, every other goes through one batchP2P.
at::Tensor transfer(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                    const CommPtr& ep) {
  const int p = ep->size(), me = ep->rank();
  TESSERA_CHECK(static_cast<int>(send.size()) == p && static_cast<int>(recv.size()) == p,
                "moe exchange on '{}' (rank {}): {} send and {} receive sizes for {} ranks", ep->name(), me,
                send.size(), recv.size(), p);
  const int64_t total = std::accumulate(send.begin(), send.end(), int64_t{0});
  TESSERA_CHECK(x.dim() == 2 && x.size(0) == total,
                "moe exchange on '{}' (rank {}): sending [{}] rows to ranks, but the input is [{}]", ep->name(), me,
                fmt::join(send, ", "), fmt::join(x.sizes(), ", "));
  auto in = x.contiguous();
  const int64_t received = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  auto out = at::empty({received, x.size(1)}, in.options());
  std::vector<P2POp> ops;
  int64_t s0 = 0, r0 = 0;
  for (int q = 0; q < p; ++q) {
    auto src = in.narrow(0, s0, send[q]);
    auto dst = out.narrow(0, r0, recv[q]);
    if (q == me) {
      TESSERA_CHECK(send[q] == recv[q], "moe exchange on '{}' (rank {}): sends itself {} rows but expects {}",
                    ep->name(), me, send[q], recv[q]);
      dst.copy_(src);
    } else {
      if (send[q] > 0) ops.push_back({P2POp::Send, src, q});
      if (recv[q] > 0) ops.push_back({P2POp::Recv, dst, q});
    }
    s0 += send[q];
    r0 += recv[q];
  }
  if (!ops.empty()) ep->batchP2P(ops)->wait();
  return out;
}

struct Exchange : torch::autograd::Function<Exchange> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::vector<int64_t> send,
                            std::vector<int64_t> recv, CommPtr ep) {
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    autograd_comm::save(ctx, ep);
    return transfer(x, send, recv, ep);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto ep = autograd_comm::load(ctx);
    auto send = ctx->saved_data["send"].toIntVector(), recv = ctx->saved_data["recv"].toIntVector();
    return {transfer(g[0], recv, send, ep), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct ScaleGrad : torch::autograd::Function<ScaleGrad> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double factor) {
    ctx->saved_data["factor"] = factor;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {g[0] * ctx->saved_data["factor"].toDouble(), at::Tensor()};
  }
};

}  // namespace

at::Tensor scaleGrad(const at::Tensor& x, double factor) { return ScaleGrad::apply(x, factor); }

at::Tensor exchangeCounts(const at::Tensor& counts, const CommPtr& ep) {
  auto in = counts.to(at::kLong).contiguous();
  TESSERA_CHECK(in.numel() % ep->size() == 0, "moe exchange on '{}': {} counts for {} ranks", ep->name(), in.numel(),
                ep->size());
  auto out = at::empty_like(in);
  ep->allToAll(out, in)->wait();
  return out;
}

at::Tensor exchangeRows(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                        const CommPtr& ep) {
  return Exchange::apply(x, send, recv, ep);
}

}  // namespace tessera::models::moe_detail
