#pragma once
// Bucket assignment: a pure function, tested without any communication.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera::ddp {

struct BucketParam {
  size_t bytes;  // numel * element size in the parameter's dtype
  int group;     // parameters of different groups (dtype, device) never share a bucket
};

// Walks `order` (indices into `params`) and fills buckets greedily: a bucket is closed when
// adding the next parameter of its group would exceed its cap (firstCap for the first bucket
// of each group, cap after); a parameter larger than the cap gets a bucket of its own.
// Buckets come out in the order they were closed, the open ones last (by group order).
std::vector<std::vector<int>> assignBuckets(const std::vector<int>& order, const std::vector<BucketParam>& params,
                                            size_t cap, size_t firstCap);

}  // namespace tessera::ddp
