#include "tessera/models/sample.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "tessera/common/error.h"

namespace tessera::models {

void validate(const SamplingOptions& o) {
  TESSERA_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
                "sampling: the temperature must be >= 0 (0: greedy), got {}", o.temperature);
  TESSERA_CHECK(o.topP > 0 && o.topP <= 1, "sampling: top-p must be in (0, 1], got {}", o.topP);
}

Sampler::Sampler(const SamplingOptions& o) : o_(o) {
  validate(o);
  gen_ = at::detail::createCPUGenerator(o.seed);
}

at::Tensor Sampler::next(const at::Tensor& logits) {
  TESSERA_CHECK(logits.defined() && logits.dim() == 2 && logits.size(1) >= 1,
                "sampling: logits must be [batch, vocab], got [{}]", logits.defined() ? c10::str(logits.sizes()) : "");
  auto l = logits.detach().to(at::kCPU, at::kDouble);
  if (o_.temperature == 0) return l.argmax(1);
  auto probs = at::softmax(l / o_.temperature, 1);
  // Descending, equal probabilities in id order (stable), so the first kept id is argmax's.
  auto [sorted, order] = probs.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
  if (o_.topP < 1) {
    // Keep an id while the mass of the ids before it is below top-p (the first is always kept).
    auto before = sorted.cumsum(1) - sorted;
    sorted = sorted.masked_fill(before >= o_.topP, 0);
  }
  auto pick = at::multinomial(sorted, 1, /*replacement=*/false, gen_);  // [batch, 1] into `order`
  return order.gather(1, pick).squeeze(1);
}

}  // namespace tessera::models
