#pragma once
// Context parallelism's split of a sequence (Megatron-Core's and torchtitan's load balancing):
// the T positions are cut into 2·cp chunks of T / (2·cp); cp rank r holds chunks r and
// 2·cp − 1 − r, in that order. Under a causal mask a late chunk attends to many keys and an early
// one to few: each rank gets one of each, so every rank does the same attention work.
//
//   cp 2, T 8:  rank 0 positions 0 1 6 7     rank 1 positions 2 3 4 5
//
// Pure functions (no communication). T not divisible by 2·cp, cp < 1 or a rank outside
// [0, cp) is a tessera::Error naming the numbers.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace tessera::cp {

// The two chunks (indices into the 2·cp chunks) of `rank`, in the order it holds them.
std::vector<int64_t> chunksOf(int cp, int rank);
// The global positions of rank's tokens, in order: T / cp of them (int64, CPU).
at::Tensor positionsOf(int64_t T, int cp, int rank);
// rank's share of `x` along dimension `dim` (of size T): its two chunks, concatenated (a copy).
at::Tensor shard(const at::Tensor& x, int64_t dim, int cp, int rank);
// The inverse of gathering every rank's shard in rank order along a dimension: the positions
// (into the gathered T) of global positions 0..T-1, for index_select (int64, CPU).
at::Tensor gatheredToGlobal(int64_t T, int cp);

}  // namespace tessera::cp
