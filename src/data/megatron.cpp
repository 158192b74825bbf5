#include "data/megatron.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "tessera/common/error.h"

namespace tessera::data {

std::string megatronPrefix(const std::string& path) {
  for (const char* ext : {".idx", ".bin"}) {
    const size_t n = std::char_traits<char>::length(ext);
    if (path.size() > n && path.compare(path.size() - n, n, ext) == 0) return path.substr(0, path.size() - n);
  }
  return path;
}

IndexedDataset::IndexedDataset(const std::string& path)
    : TokenSource(megatronPrefix(path)), idx_(megatronPrefix(path) + ".idx"), bin_(megatronPrefix(path) + ".bin") {
  index_ = parseMegatronIndex(idx_.data(), idx_.size(), bin_.size(), idx_.path());
  for (int64_t i = 0; i < index_.sequences; ++i) tokens_ += index_.length(i);
}

int64_t IndexedDataset::sequenceLength(int64_t i) const {
  TESSERA_CHECK(i >= 0 && i < index_.sequences, "tessera data: sequence {} out of range [0, {}) in '{}'", i,
                index_.sequences, idx_.path());
  return index_.length(i);
}

at::Tensor IndexedDataset::sequence(int64_t i) const {
  auto t = at::empty({sequenceLength(i)}, at::kLong);
  read(i, 0, t.numel(), t.data_ptr<int64_t>());
  return t;
}

at::Tensor IndexedDataset::documentIndices() const {
  auto t = at::empty({index_.docIndices}, at::kLong);
  auto* p = t.data_ptr<int64_t>();
  for (int64_t k = 0; k < index_.docIndices; ++k) p[k] = index_.docIndex(k);
  return t;
}

void IndexedDataset::read(int64_t doc, int64_t offset, int64_t count, int64_t* out) const {
  checkRange(doc, offset, count);
  const auto bytes = static_cast<int64_t>(tokenBytes(index_.type));
  widenTokens(bin_.data() + index_.pointer(doc) + offset * bytes, index_.type, count, out);
}

std::vector<int64_t> IndexedDataset::splitPoints() const {
  std::vector<int64_t> out;
  for (int64_t k = 0; k + 1 < index_.docIndices; ++k) {
    if (out.empty() || out.back() != index_.docIndex(k)) out.push_back(index_.docIndex(k));
  }
  if (out.empty()) out.push_back(0);
  return out;
}

std::string IndexedDataset::where(int64_t doc, int64_t offset) const {
  // Megatron's document holding sequence `doc`: the last index <= doc.
  int64_t lo = 0, hi = index_.docIndices - 1;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (index_.docIndex(mid) <= doc ? lo : hi) = mid;
  }
  return fmt::format("'{}' sequence {} position {} (document {})", bin_.path(), doc, offset, lo);
}

std::string IndexedDataset::describe() const {
  return fmt::format("megatron {} '{}': {} sequences, {} documents, {} tokens", tokenTypeName(index_.type), path(),
                     index_.sequences, std::max<int64_t>(0, index_.docIndices - 1), tokens_);
}

uint64_t IndexedDataset::fingerprint() const {
  return hashSampledPages(bin_.data(), bin_.size(), hashBytes(idx_.data(), idx_.size()));
}

}  // namespace tessera::data
