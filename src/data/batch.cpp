#include "tessera/data/batch.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

#include "tessera/common/error.h"

namespace tessera::data {

at::Tensor readSamples(const Blend& b, int64_t first, int64_t rows, int64_t vocab, at::Tensor into) {
  const int64_t row = b.seqLen() + 1;
  if (!into.defined()) into = at::empty({rows, row}, at::kLong);
  TESSERA_CHECK(into.device().is_cpu() && into.scalar_type() == at::kLong && into.is_contiguous() &&
                    into.sizes() == at::IntArrayRef({rows, row}),
                "tessera data: readSamples needs a contiguous int64 CPU tensor of [{}, {}], got {} {} on {}", rows, row,
                c10::str(into.sizes()), c10::toString(into.scalar_type()), into.device().str());
  int64_t* p = into.data_ptr<int64_t>();
  b.read(first, rows, p);
  // One unsigned compare per token; the offending token is searched only on failure.
  bool bad = false;
  for (int64_t i = 0; i < rows * row; ++i) bad |= static_cast<uint64_t>(p[i]) >= static_cast<uint64_t>(vocab);
  if (!bad) return into;
  for (int64_t i = 0; i < rows * row; ++i) {
    if (p[i] < 0 || p[i] >= vocab) {
      throw Error(fmt::format("tessera data: token id {} of sample {} (row {}, position {}) is outside the model's "
                              "vocabulary [0, {}): {}",
                              p[i], first + i / row, i / row, i % row, vocab, b.where(first + i / row, i % row)));
    }
  }
  return into;
}

TokenBatch splitSamples(const at::Tensor& samples) {
  const int64_t t = samples.size(1) - 1;
  return {samples.narrow(1, 0, t), samples.narrow(1, 1, t)};
}

std::string encodeDataState(const DataState& s) {
  return fmt::format("samples={} fingerprint={:016x} data={}", s.consumedSamples, s.fingerprint, s.description);
}

DataState decodeDataState(const std::string& text) {
  DataState s;
  std::istringstream in(text);
  std::string samples, fp;
  in >> samples >> fp;
  const bool ok = samples.rfind("samples=", 0) == 0 && fp.rfind("fingerprint=", 0) == 0;
  try {
    TESSERA_CHECK(ok, "");
    s.consumedSamples = std::stoll(samples.substr(8));
    s.fingerprint = std::stoull(fp.substr(12), nullptr, 16);
  } catch (const std::exception&) {
    throw Error(fmt::format("tessera data: malformed data state '{}' in the checkpoint", text));
  }
  const auto at = text.find(" data=");
  if (at != std::string::npos) s.description = text.substr(at + 6);
  return s;
}

int64_t resumePosition(const DataState& saved, const DataState& current) {
  TESSERA_CHECK(saved.fingerprint == current.fingerprint,
                "tessera data: the checkpoint was trained on other data than this run is given (or with another "
                "split, seed, sequence length or blend).\n  checkpoint: {}\n  this run:   {}",
                saved.description, current.description);
  return saved.consumedSamples;
}

}  // namespace tessera::data
