#pragma once
// Learning-rate schedules as pure functions of the step (local; no state, so a resumed run
// needs only its step): linear warm-up from 0 over `warmup` steps, then to `minLr` by `total`
// steps along a cosine, a line, or WSD (warm-up, stable at `lr`, then a linear decay over the
// last `decay` steps). `constant` is `lr` after the warm-up. Past `total`, minLr (constant: lr).
// Step s (0-based) trains with lrAt(s): the warm-up's first step takes lr / warmup.
// Bad options (negative steps, warm-up or decay longer than the run, minLr > lr, an unknown
// kind) are a tessera::Error naming the option.
#include <cstdint>
#include <string>

namespace tessera::optim {

enum class LrKind { Constant, Cosine, Linear, Wsd };
// "constant" | "cosine" | "linear" | "wsd".
LrKind parseLrKind(const std::string& s);
const char* toString(LrKind k);

struct LrSchedule {
  LrKind kind = LrKind::Constant;
  double lr = 1e-3, minLr = 0;
  int64_t warmup = 0;  // steps
  int64_t total = 0;   // steps of the whole run (the decay ends here); 0: the run's --steps
  int64_t decay = 0;   // WSD: steps of the final decay; 0: total / 5
};

void validate(const LrSchedule& s);
double lrAt(const LrSchedule& s, int64_t step);
std::string describe(const LrSchedule& s);

}  // namespace tessera::optim
