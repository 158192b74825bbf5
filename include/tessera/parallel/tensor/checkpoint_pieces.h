#pragma once
// Checkpoint pieces (src/checkpoint) of tensor-parallel layers: this rank's shards, each placed
// in the unsharded tensor it is part of, under the unsharded model's names (for a block: the
// names ParallelBlock::loadFull reads, after `prefix`: ln1.*, qkv.*, proj.*, ln2.*, fc1.*,
// fc2.*). A checkpoint saved at one TP degree therefore loads at any other that divides the
// sizes, or into the unsharded model (TP 1), and checkpoint::load reshards.
// - Column-parallel: rows [r·out/tp, (r+1)·out/tp) of weight [out, in] and bias [out].
// - Row-parallel: columns [r·in/tp, (r+1)·in/tp) of weight [out, in]; the bias is replicated.
// - qkv: rank r holds the q, k and v rows of its heads, three boxes of the [3d, d] weight.
// - LayerNorms: replicated (also with sequence parallel, where each rank keeps a full copy).
// The pieces' local tensors alias the parameters (detached views): save reads them, load
// fills the parameters in place. Local; no communication.
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/parallel/tensor/blocks.h"
#include "tessera/parallel/tensor/linear.h"

namespace tessera::tp {

std::vector<checkpoint::Piece> columnPieces(ColumnParallelLinearImpl& l, const std::string& name);
std::vector<checkpoint::Piece> rowPieces(RowParallelLinearImpl& l, const std::string& name);
std::vector<checkpoint::Piece> blockPieces(ParallelBlockImpl& b, const std::string& prefix);

}  // namespace tessera::tp
