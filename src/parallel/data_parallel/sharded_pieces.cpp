// FSDP's checkpoint and export pieces; see sharded_pieces.h.
#include "parallel/data_parallel/sharded_pieces.h"

#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <optional>

#include "tessera/common/error.h"
#include "parallel/data_parallel/pieces.h"

namespace tessera::dp {

namespace {
// FSDP's resharded parameters keep their sizes over a storage of 0 bytes, and LibTorch checks
// views against their storage: while alive, each such storage says the bytes its parameters
// span (the data pointer stays null: nothing is allocated or touched), so the model's pieces can
// be taken as views whose sizes, strides and offsets locate the values in the unit's flat buffer.
class SizedStorages {
 public:
  explicit SizedStorages(const std::vector<NamedParam>& ps) {
    std::map<c10::StorageImpl*, size_t> need;
    for (const auto& p : ps) {
      auto* s = p.tensor.storage().unsafeGetStorageImpl();
      if (s->nbytes() > 0) continue;  // gathered
      auto& n = need[s];
      n = std::max(n, static_cast<size_t>(p.tensor.storage_offset() + p.tensor.numel()) * p.tensor.element_size());
    }
    for (const auto& [s, n] : need) {
      s->set_nbytes(n);
      sized_.push_back(s);
    }
  }
  ~SizedStorages() {
    for (auto* s : sized_) s->set_nbytes(0);
  }
  SizedStorages(const SizedStorages&) = delete;

 private:
  std::vector<c10::StorageImpl*> sized_;
};

}  // namespace

std::vector<checkpoint::Piece> piecesOfSized(const std::vector<NamedParam>& params,
                                             const DataParallel::PieceSource& source) {
  SizedStorages sized(params);
  return source();
}

Places placesInUnits(const FullyShardedDataParallel& fsdp) {
  Places where;
  for (size_t u = 0; u < fsdp.numUnits(); ++u) {
    for (const auto& e : fsdp.layout(u).entries) where[e.name] = {u, e.offset};
  }
  return where;
}

FlatFull flatFull(FullyShardedDataParallel& fsdp, const ShardedAdamW& adam, bool gather) {
  FlatFull f;
  f.where = placesInUnits(fsdp);
  const auto sd = adam.stateDict();
  for (size_t u = 0; u < fsdp.numUnits(); ++u) {
    const auto& lay = fsdp.layout(u);
    std::array<at::Tensor, 3> full;
    int i = 0;
    for (const auto& shard : {fsdp.masterShard(u), sd.at(fsdp.unitName(u) + ".exp_avg"),
                              sd.at(fsdp.unitName(u) + ".exp_avg_sq")}) {
      full[i++] = gather ? fsdp.gatherFull(u, shard) : at::zeros({lay.paddedNumel}, fsdp.masterShard(u).options());
    }
    f.flat.push_back(full);
  }
  return f;
}

std::vector<checkpoint::Piece> fsdpTrainingPieces(FullyShardedDataParallel& fsdp,
                                                  const DataParallel::PieceSource& modelPieces,
                                                  const std::vector<NamedParam>& params,
                                                  const std::shared_ptr<FlatFull>& full) {
  std::vector<checkpoint::Piece> pieces;
  {
    SizedStorages sized(params);
    pieces = modelPieces();
  }
  return trainingPieces(pieces, params, [&](const checkpoint::Piece& piece, size_t k, int what) {
    const auto& [u, offset] = full->where.at(params[k].name);
    return sameBox(piece.local, params[k].tensor, full->flat[u][what], offset);
  });
}

void keepShards(FullyShardedDataParallel& fsdp, ShardedAdamW& adam, const FlatFull& f, int64_t step) {
  auto model = fsdp.shardedStateDict();
  auto opt = adam.stateDict();
  const int r = fsdp.shardRank();
  for (size_t u = 0; u < fsdp.numUnits(); ++u) {
    const auto& lay = fsdp.layout(u);
    const auto& name = fsdp.unitName(u);
    auto shard = [&](int what, int64_t n) { return f.flat[u][what].narrow(0, r * lay.shardNumel, n); };
    model[name + ".flat_shard"] = shard(0, lay.shardNumel);
    opt[name + ".exp_avg"] = shard(1, lay.trainableInShard(r));
    opt[name + ".exp_avg_sq"] = shard(2, lay.trainableInShard(r));
  }
  opt["step"] = at::tensor(step, at::kLong);
  fsdp.loadShardedStateDict(model);
  adam.loadStateDict(opt);
}

DataParallel::Lookup gatheringLookup(FullyShardedDataParallel& fsdp, const DataParallel::PieceSource& modelPieces,
                                     const std::vector<NamedParam>& params) {
  // This rank's pieces by name with the parameter each is a view of: its values live in the
  // unit's flat shard, gathered when a tensor of the unit is asked for.
  struct State {
    std::map<std::string, std::vector<std::pair<checkpoint::Piece, size_t>>> byName;
    Places where;
    size_t gatheredUnit = SIZE_MAX;
    at::Tensor gathered;  // that unit's full fp32 flat buffer
  };
  auto st = std::make_shared<State>();
  {
    SizedStorages sized(params);
    for (auto& p : modelPieces()) {
      if (p.state) continue;  // no parameter: not in a unit's shard (an MoE router's bias)
      const size_t k = paramOf(p.local, params, fmt::format("HF export: piece '{}'", p.name));
      st->byName[p.name].emplace_back(p, k);
    }
  }
  st->where = placesInUnits(fsdp);
  return [&fsdp, &params, st](const std::string& name) {
    std::vector<checkpoint::Piece> out;
    const auto it = st->byName.find(name);
    if (it == st->byName.end()) return out;
    for (const auto& [piece, k] : it->second) {
      const auto [u, offset] = st->where.at(params[k].name);
      if (u != st->gatheredUnit) {  // collective over the shard group: every rank asks for the same tensors
        st->gathered = fsdp.gatherFull(u, fsdp.masterShard(u));
        st->gatheredUnit = u;
      }
      out.push_back({piece.name, piece.globalShape, piece.offset,
                     sameBox(piece.local, params[k].tensor, st->gathered, offset)});
    }
    return out;
  };
}

}  // namespace tessera::dp
