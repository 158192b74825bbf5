#pragma once
// Internal to data_parallel/: checkpoint and export pieces of FSDP's flat shards. Each unit's
// master / exp_avg / exp_avg_sq shards are all-gathered over the shard group into full fp32 flat
// buffers (collective), and every piece is a view of those in the box its parameter's piece has
// (worked out from the parameters' sizes, no values read); on load the pieces fill fresh full
// buffers and each rank keeps its shard (keepShards).
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/parallel/data_parallel/data_parallel.h"
#include "tessera/parallel/data_parallel/fsdp/optimizer.h"

namespace tessera::dp {

// Where each parameter lies: name -> (its unit, its offset in the unit's flat buffer).
using Places = std::map<std::string, std::pair<size_t, int64_t>>;
Places placesInUnits(const FullyShardedDataParallel& fsdp);

// Per unit, full flat buffers [paddedNumel] of master, exp_avg, exp_avg_sq, and where each
// parameter starts in them.
struct FlatFull {
  std::vector<std::array<at::Tensor, 3>> flat;  // per unit
  Places where;
};
// gather: all-gathered over the shard group (collective); else zeros to load into (local).
FlatFull flatFull(FullyShardedDataParallel& fsdp, const ShardedAdamW& adam, bool gather);
// The training pieces (data_parallel.h) as views of `full`. Local: the model pieces are taken as
// views of the resharded parameters over storages sized for the occasion (no unit is gathered).
std::vector<checkpoint::Piece> fsdpTrainingPieces(FullyShardedDataParallel& fsdp,
                                                  const DataParallel::PieceSource& modelPieces,
                                                  const std::vector<NamedParam>& params,
                                                  const std::shared_ptr<FlatFull>& full);
// After a load into `full`: this rank's shard of each buffer back into FSDP and the optimizer.
void keepShards(FullyShardedDataParallel& fsdp, ShardedAdamW& adam, const FlatFull& full, int64_t step);
// `source`'s pieces taken while every resharded parameter of `params` has a storage sized for its
// views (none is allocated or gathered), as fsdpTrainingPieces takes them. Local.
std::vector<checkpoint::Piece> piecesOfSized(const std::vector<NamedParam>& params,
                                             const DataParallel::PieceSource& source);
// An export's lookup: a unit all-gathered (collective) when one of its tensors is first asked for.
DataParallel::Lookup gatheringLookup(FullyShardedDataParallel& fsdp, const DataParallel::PieceSource& modelPieces,
                                     const std::vector<NamedParam>& params);

}  // namespace tessera::dp
