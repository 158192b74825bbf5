#include "parallel/data_parallel/ddp/validate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/comm/types.h"

namespace tessera::ddp {
namespace {

// "" when a parameter or buffer of t's dtype can be broadcast from rank 0, else why not.
std::string unbroadcastable(const char* kind, const std::string& name, const at::Tensor& t) {
  if (isSupportedDtype(t.scalar_type())) return "";
  return fmt::format("{} '{}' has dtype {}; {}s are broadcast from rank 0, which takes float32, bfloat16, float16, "
                     "int32 or int64",
                     kind, name, dtypeName(t.scalar_type()), kind);
}

std::string paramProblem(const DistributedDataParallel::Named& params, const DdpOptions& o) {
  if (params.empty()) return "no parameters given";
  const std::pair<std::string, at::Tensor>* first = nullptr;
  for (const auto& p : params) {
    const auto& [name, t] = p;
    if (auto problem = unbroadcastable("parameter", name, t); !problem.empty()) return problem;
    if (!t.requires_grad()) continue;
    if (!first) first = &p;
    if (t.device() != first->second.device()) {
      return fmt::format("parameter '{}' is on {}, '{}' on {}", name, t.device().str(), first->first,
                         first->second.device().str());
    }
    if (!t.is_contiguous()) return fmt::format("parameter '{}' is not contiguous", name);
    if (!isFloatingDtype(t.scalar_type())) {
      return fmt::format("parameter '{}' has dtype {}; gradients must be float32, bfloat16 or float16", name,
                         dtypeName(t.scalar_type()));
    }
    if (!t.is_leaf()) return fmt::format("parameter '{}' is not a leaf tensor (it has a grad_fn)", name);
    if (o.gradientAsBucketView && o.commDtype && t.scalar_type() != *o.commDtype) {
      return fmt::format("gradientAsBucketView needs gradients in the communication dtype, but parameter '{}' is {} "
                         "and commDtype is {}",
                         name, dtypeName(t.scalar_type()), dtypeName(*o.commDtype));
    }
  }
  if (!first) return "no parameter requires a gradient";
  return "";
}

std::string optionProblem(const DdpOptions& o) {
  if (o.commDtype && !isFloatingDtype(*o.commDtype)) {
    return fmt::format("commDtype {} is not a floating dtype", dtypeName(*o.commDtype));
  }
  if (o.bucketCapBytes == 0 || o.firstBucketCapBytes == 0) {
    return fmt::format("bucket caps must be positive (bucketCapBytes {}, firstBucketCapBytes {})", o.bucketCapBytes,
                       o.firstBucketCapBytes);
  }
  if (o.smCarveout < 0) return fmt::format("smCarveout {} is negative (a number of SMs)", o.smCarveout);
  if (o.onBucketReduced && o.findUnusedParameters) {
    return "onBucketReduced (an optimizer step per bucket during backward) cannot be combined with "
           "findUnusedParameters: which parameters got no gradient is known only at the end of backward";
  }
  if (o.onBucketReduced && o.gatherEmbeddingRows) {
    return "onBucketReduced (an optimizer step per bucket during backward) cannot be combined with "
           "gatherEmbeddingRows: an embedding's gathered rows are added only at the end of backward";
  }
  return "";
}

}  // namespace

std::string localProblem(const DistributedDataParallel::Named& params, const DistributedDataParallel::Named& buffers,
                         const DdpOptions& opts) {
  auto problem = optionProblem(opts);
  if (problem.empty()) problem = paramProblem(params, opts);
  for (const auto& [name, t] : buffers) {
    if (!problem.empty()) break;
    problem = unbroadcastable("buffer", name, t);
  }
  return problem;
}

RankState describeRank(const DistributedDataParallel::Named& params, const DistributedDataParallel::Named& buffers,
                       const DdpOptions& o) {
  RankState s;
  s.problem = localProblem(params, buffers, o);
  s.options = {
      fmt::format("bucketCapBytes={}", o.bucketCapBytes),
      fmt::format("firstBucketCapBytes={}", o.firstBucketCapBytes),
      fmt::format("gradientAsBucketView={}", o.gradientAsBucketView),
      fmt::format("commDtype={}", o.commDtype ? dtypeName(*o.commDtype) : std::string("unset")),
      fmt::format("findUnusedParameters={}", o.findUnusedParameters),
      fmt::format("broadcastBuffers={}", o.broadcastBuffers),
      fmt::format("rebuildBuckets={}", o.rebuildBuckets),
      fmt::format("gatherEmbeddingRows={}", o.gatherEmbeddingRows),
  };
  for (const auto& [name, t] : params) s.params.push_back(describeTensor(name, t, /*withGrad=*/true));
  for (const auto& [name, t] : buffers) s.buffers.push_back(describeTensor(name, t, /*withGrad=*/false));
  return s;
}

}  // namespace tessera::ddp
