#pragma once
// DDP's construction-time checks, local to one rank (no communication): what a rank brings to
// ddp::agree() (param_sync.h), which turns any rank's problem or any difference between the
// ranks into the same error on every rank, so no rank is left waiting in a collective.
#include "tessera/parallel/data_parallel/ddp/ddp.h"
#include "parallel/data_parallel/ddp/param_sync.h"

namespace tessera::ddp {

// The first reason this rank's arguments cannot work ("" when none), without the rank (agree()
// adds it): no parameters; none with requires_grad; a parameter with requires_grad that is
// not a contiguous floating-point (float32, bfloat16, float16) leaf on the first one's device;
// a parameter or buffer of a dtype that cannot be broadcast; contradictory or out-of-range
// options (caps, commDtype, gradientAsBucketView, smCarveout, onBucketReduced).
std::string localProblem(const DistributedDataParallel::Named& params, const DistributedDataParallel::Named& buffers,
                         const DdpOptions& opts);

// The problem above, and descriptions the ranks must share:
// - options that shape buckets or communication ("bucketCapBytes=26214400", ...; not
//   smCarveout or onBucketReduced, which are local to a rank);
// - each parameter and buffer: describeTensor (param_sync.h), requires_grad for parameters.
RankState describeRank(const DistributedDataParallel::Named& params, const DistributedDataParallel::Named& buffers,
                       const DdpOptions& opts);

}  // namespace tessera::ddp
