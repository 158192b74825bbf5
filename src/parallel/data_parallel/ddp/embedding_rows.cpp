// Reducer, the gathered embedding rows (DdpOptions::gatherEmbeddingRows; see reducer.h): a
// row-gradient sink on every parameter (nn/accum_embedding.h) takes an embedding lookup's rows in a
// synchronised backward, all-gathers them over the group, and the end of backward sums every
// rank's rows into .grad after the parameter's all-reduce.
#include <ATen/ATen.h>

#include "tessera/common/error.h"
#include "tessera/nn/accum_embedding.h"
#include "tessera/nn/stale_grads.h"
#include "parallel/data_parallel/ddp/reducer.h"

namespace tessera {

void Reducer::installRowSinks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& t = params_[i].tensor;
    if (t.dim() != 2) continue;  // an embedding table is [vocab, dim]
    TESSERA_CHECK(t.size(0) <= (int64_t{1} << 24),
                  "DistributedDataParallel (gatherEmbeddingRows): parameter '{}' has {} rows; gathered ids travel as "
                  "float32, exact below 2^24",
                  params_[i].name, t.size(0));
    const int idx = static_cast<int>(i);
    nn::setRowGradSink(t, [this, idx](const at::Tensor& ids, const at::Tensor& rows) {
      return offerRows(idx, ids, rows);
    });
  }
  rowSinks_ = true;
}

void Reducer::removeRowSinks() {
  if (!rowSinks_) return;
  for (const auto& p : params_) nn::setRowGradSink(p.tensor, {});
  rowSinks_ = false;
}

bool Reducer::offerRows(int param, const at::Tensor& ids, const at::Tensor& rows) {
  if (!sync_) return false;  // noSync: summed into .grad, all-reduced with it at the synchronised step
  std::lock_guard<std::mutex> lock(mu_);
  beginIteration();
  gathered_.push_back({param, gatherRows(comm_, ids, rows)});
  return true;
}

void Reducer::addGatheredRows(bool deliver) {
  auto taken = std::move(gathered_);
  gathered_.clear();
  for (auto& [param, g] : taken) {
    g.wait();
    if (!deliver) continue;
    const auto& p = params_[param].tensor;
    nn::zeroIfStale(p);
    auto& grad = p.mutable_grad();
    if (!grad.defined()) grad = at::zeros_like(p, at::MemoryFormat::Contiguous);
    grad.index_put_({g.ids.to(at::kLong)}, g.rows.to(at::kFloat).div_(static_cast<double>(comm_->size())),
                    /*accumulate=*/true);
  }
}

}  // namespace tessera
