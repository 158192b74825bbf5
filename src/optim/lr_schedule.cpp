#include "tessera/optim/lr_schedule.h"

#include <fmt/format.h>

#include <cmath>

#include "common/choice.h"
#include "tessera/common/error.h"

namespace tessera::optim {

namespace {
constexpr Choices<LrKind, 4> kLrKind{
    "lr schedule",
    {{{LrKind::Constant, "constant"}, {LrKind::Cosine, "cosine"}, {LrKind::Linear, "linear"}, {LrKind::Wsd, "wsd"}}}};
}  // namespace

LrKind parseLrKind(const std::string& s) { return kLrKind.parse(s); }
const char* toString(LrKind k) { return kLrKind.name(k); }

void validate(const LrSchedule& s) {
  TESSERA_CHECK(s.lr > 0 && std::isfinite(s.lr), "lr schedule: lr must be > 0, got {}", s.lr);
  TESSERA_CHECK(s.minLr >= 0 && s.minLr <= s.lr, "lr schedule: min lr {} must be in [0, lr = {}]", s.minLr, s.lr);
  TESSERA_CHECK(s.total >= 1, "lr schedule: the run's length must be >= 1 step, got {}", s.total);
  TESSERA_CHECK(s.warmup >= 0 && s.warmup <= s.total, "lr schedule: warm-up of {} steps in a run of {}", s.warmup,
                s.total);
  TESSERA_CHECK(s.kind != LrKind::Wsd || (s.decay >= 0 && s.warmup + s.decay <= s.total),
                "lr schedule: wsd's warm-up {} + decay {} steps exceed the run of {}", s.warmup, s.decay, s.total);
}

double lrAt(const LrSchedule& s, int64_t step) {
  if (step < s.warmup) return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup);
  if (s.kind == LrKind::Constant) return s.lr;
  if (step >= s.total) return s.minLr;
  int64_t start = s.warmup, length = s.total - s.warmup;
  if (s.kind == LrKind::Wsd) {
    const int64_t decay = s.decay > 0 ? s.decay : s.total / 5;
    start = s.total - decay;
    length = decay;
    if (step < start) return s.lr;
  }
  if (length <= 0) return s.minLr;
  const double t = static_cast<double>(step - start) / static_cast<double>(length);  // in [0, 1)
  const double f = s.kind == LrKind::Cosine ? 0.5 * (1 + std::cos(M_PI * t)) : 1 - t;
  return s.minLr + (s.lr - s.minLr) * f;
}

std::string describe(const LrSchedule& s) {
  // "lr 0.0003: warm-up over 5 steps, then cosine to 0 at step 40"
  return fmt::format(
      "lr {:g}: {}{}{}{}", s.lr,
      s.warmup ? fmt::format("warm-up over {} step{}, then ", s.warmup, s.warmup == 1 ? "" : "s") : "",
      toString(s.kind), s.kind != LrKind::Constant ? fmt::format(" to {:g} at step {}", s.minLr, s.total) : "",
      s.kind == LrKind::Wsd ? fmt::format(" (decay over the last {} steps)", s.decay > 0 ? s.decay : s.total / 5) : "");
}

}  // namespace tessera::optim
