// The per-step cache of weights' FP8 codes (contract in fp8_weight_cache.h).
#include "parallel/tensor/fp8_weight_cache.h"

#include <map>
#include <mutex>
#include <tuple>

#include "tessera/common/error.h"

namespace tessera::tp {
namespace {

struct Entry {
  at::Tensor weight;  // kept alive: its address stays its own while the entry exists
  kernels::Fp8Codes codes;
};

struct Cache {
  std::mutex mutex;
  bool open = false;
  int64_t hits = 0;
  std::map<std::tuple<const void*, int64_t, int>, Entry> entries;
};

Cache& cache() {
  static Cache c;
  return c;
}

std::tuple<const void*, int64_t, int> keyOf(const at::Tensor& w, detail::WeightUse use) {
  return {w.unsafeGetTensorImpl(), static_cast<int64_t>(w._version()), static_cast<int>(use)};
}

}  // namespace

Fp8WeightCacheScope::Fp8WeightCacheScope(bool on) : on_(on) {
  if (!on_) return;
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  TESSERA_CHECK(!c.open, "tp::Fp8WeightCacheScope: a scope is already open (one at a time)");
  c.open = true;
  c.hits = 0;
}

Fp8WeightCacheScope::~Fp8WeightCacheScope() {
  if (!on_) return;
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.open = false;
  c.entries.clear();
}

int64_t Fp8WeightCacheScope::hits() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.hits;
}

namespace detail {

bool weightCacheOpen() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.open;
}

std::optional<kernels::Fp8Codes> cachedWeight(const at::Tensor& weight, WeightUse use) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.open) return std::nullopt;
  auto it = c.entries.find(keyOf(weight, use));
  if (it == c.entries.end()) return std::nullopt;
  ++c.hits;
  return it->second.codes;
}

void keepWeight(const at::Tensor& weight, WeightUse use, const kernels::Fp8Codes& codes) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.open) c.entries[keyOf(weight, use)] = Entry{weight, codes};
}

}  // namespace detail
}  // namespace tessera::tp
