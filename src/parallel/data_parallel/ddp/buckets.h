#pragma once
// Bucket assignment: a pure function, tested without any communication.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::ddp {

struct BucketParam {
  size_t bytes;  // numel * element size in the parameter's dtype
  int group;     // parameters of different groups (dtype, device) never share a bucket
};

// Walks `order` (indices into `params`) and fills buckets greedily: a parameter joins the
// open bucket of its group, which is closed as soon as it holds at least its cap (firstCap
// for the first bucket of each group, cap after). So small parameters (biases, norms) ride
// with the next large one instead of making latency-bound buckets of their own (on the
// GPT-735M, closing *before* overflowing made 75 buckets, every other one a few KiB).
// Buckets come out in the order they were closed, the open ones last (by group order).
// `order` must be a permutation of 0..params.size()-1 (else tessera::Error, see orderProblem).
std::vector<std::vector<int>> assignBuckets(const std::vector<int>& order, const std::vector<BucketParam>& params,
                                            size_t cap, size_t firstCap);

// "" when `order` is a permutation of 0..n-1; else what is wrong with it: the first index
// out of range, appearing twice, or missing ("index 3 appears twice"; with `names` (n of
// them): "index 3 ('fc1.bias') appears twice").
std::string orderProblem(const std::vector<int>& order, size_t n, const std::vector<std::string>& names = {});

}  // namespace tessera::ddp
