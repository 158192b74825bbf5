// train_gpt: the gradient pieces of the global norm, the tied embeddings' gradient sum over the
// embedding group, and the validation loss (trainer.h).
#include <ATen/ATen.h>

#include <map>

#include "common/error.h"
#include "trainer_state.h"

namespace tessera::gpt {

namespace {
// Squares weighted so that each element of the model counts once over the tp and pp ranks.
double normWeight(const ChunkParam& p, int tp) { return (p.replicatedOverTp ? 1.0 / tp : 1.0) / p.ppCopies; }

// `flat` (elements [begin, end) of p, flattened), split where p's replicated rows begin.
void addPieces(std::vector<GradPiece>& out, const at::Tensor& flat, int64_t begin, const ChunkParam& p, int tp) {
  const double w = normWeight(p, tp);
  const int64_t end = begin + flat.numel();
  if (p.replicatedFrom < 0 || p.replicatedFrom >= end) {
    out.push_back({flat, w});
    return;
  }
  const int64_t cut = std::max(begin, p.replicatedFrom);
  if (cut > begin) out.push_back({flat.narrow(0, 0, cut - begin), w});
  out.push_back({flat.narrow(0, cut - begin, end - cut), w / p.replicas});
}
}  // namespace

std::vector<GradPiece> Trainer::State::gradPieces() const {
  std::vector<GradPiece> out;
  const auto ps = params();
  if (!fsdp) {
    for (const auto& p : ps) addPieces(out, p.tensor.grad().view({-1}), 0, p, o.tp);
    return out;
  }
  std::map<std::string, const ChunkParam*> byName;
  for (const auto& p : ps) byName[p.name] = &p;
  const int r = fsdp->shardRank();
  for (size_t u = 0; u < fsdp->numUnits(); ++u) {
    const auto& lay = fsdp->layout(u);
    auto g = fsdp->gradShard(u);
    const int64_t lo = r * lay.shardNumel, hi = lo + lay.shardNumel;
    for (const auto& e : lay.entries) {
      const int64_t a = std::max(lo, e.offset), b = std::min(hi, e.offset + e.numel);
      if (!e.trainable || a >= b) continue;
      addPieces(out, g.narrow(0, a - lo, b - a), a - e.offset, *byName.at(e.name), o.tp);
    }
  }
  return out;
}

void Trainer::State::syncTiedEmbeddings() {
  if (!embGroup) return;
  for (size_t k = 0; k < chunks.size(); ++k) {
    auto& c = chunks[k];
    auto table = c->tiedTable();
    if (!table.defined()) continue;
    // FSDP: the table's unit holds only the table on both stages, so the shards line up.
    auto g = fsdp ? fsdp->gradShard(firstUnit[k] + c->tiedUnit()) : table.grad();
    TESSERA_CHECK(g.defined(), "train_gpt: rank {}: the tied embedding table of stage {} has no gradient",
                  ctx.world->rank(), c->stage);
    embGroup->allReduce(g, ReduceOp::Sum)->wait();
  }
}

double Trainer::State::validationLoss() {
  for (auto& c : chunks) c->eval();
  auto sum = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (int k = 0; k < o.evalBatches; ++k) {
    auto b = batches->validBatch(k);
    sum += exec->evaluate(firstPp() ? b.tokens : at::Tensor(), lastPp() ? b.targets : at::Tensor());
  }
  for (auto& c : chunks) c->train();
  // A forward without backward leaves FSDP's pass open and its non-resharding units gathered: end
  // it, or the next checkpoint's unshardAll() is refused ("called inside a forward/backward pass").
  if (fsdp) fsdp->reshardAll();
  if (mesh->dataGroup()->size() > 1) mesh->dataGroup()->allReduce(sum, ReduceOp::Avg)->wait();
  return sum.item<double>() / o.evalBatches;
}

}  // namespace tessera::gpt
