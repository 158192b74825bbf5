#include "tessera/data/blend.h"

#include <algorithm>
#include <cmath>

#include "tessera/common/error.h"

namespace tessera::data {

Blend::Blend(std::vector<std::shared_ptr<const DocumentSamples>> parts, std::vector<double> weights)
    : parts_(std::move(parts)), weights_(std::move(weights)) {
  TESSERA_CHECK(!parts_.empty() && parts_.size() == weights_.size(),
                "tessera data: a blend needs one weight per dataset ({} datasets, {} weights)", parts_.size(),
                weights_.size());
  double sum = 0;
  for (size_t j = 0; j < parts_.size(); ++j) {
    TESSERA_CHECK(weights_[j] > 0 && std::isfinite(weights_[j]), "tessera data: blend weight {} of '{}' must be > 0",
                  weights_[j], parts_[j]->source().path());
    TESSERA_CHECK(parts_[j]->seqLen() == parts_[0]->seqLen(), "tessera data: blended datasets differ in sequence length");
    sum += weights_[j];
  }
  for (auto& w : weights_) w /= sum;
  marks_.push_back(std::vector<int64_t>(parts_.size(), 0));
}

int Blend::choose(int64_t g, const std::vector<int64_t>& taken) const {
  int best = 0;
  double bestErr = 0;
  const double at = static_cast<double>(std::max<int64_t>(g, 1));
  for (size_t j = 0; j < parts_.size(); ++j) {
    const double err = weights_[j] * at - static_cast<double>(taken[j]);
    if (j == 0 || err > bestErr) {
      best = static_cast<int>(j);
      bestErr = err;
    }
  }
  return best;
}

std::vector<std::pair<int, int64_t>> Blend::locate(int64_t first, int64_t n) const {
  TESSERA_CHECK(first >= 0 && n >= 0, "tessera data: samples [{}, {}) of a blend", first, first + n);
  std::vector<std::pair<int, int64_t>> out;
  out.reserve(n);
  if (parts_.size() == 1) {
    for (int64_t g = first; g < first + n; ++g) out.emplace_back(0, g);
    return out;
  }
  std::vector<int64_t> taken;
  int64_t g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Extend the marks up to `first`, then start from the last one at or before it.
    while (static_cast<int64_t>(marks_.size()) * kMark <= first) {
      auto next = marks_.back();
      for (int64_t i = (static_cast<int64_t>(marks_.size()) - 1) * kMark; i < static_cast<int64_t>(marks_.size()) * kMark;
           ++i) {
        ++next[choose(i, next)];
      }
      marks_.push_back(std::move(next));
    }
    g = first / kMark * kMark;
    taken = marks_[first / kMark];
  }
  for (; g < first + n; ++g) {
    const int j = choose(g, taken);
    if (g >= first) out.emplace_back(j, taken[j]);
    ++taken[j];
  }
  return out;
}

void Blend::read(int64_t first, int64_t n, int64_t* out) const {
  const int64_t row = seqLen() + 1;
  for (const auto& [j, c] : locate(first, n)) {
    parts_[j]->read(c, out);
    out += row;
  }
}

std::string Blend::where(int64_t g, int64_t j) const {
  const auto [part, c] = locate(g, 1).front();
  return parts_[part]->where(c, j);
}

}  // namespace tessera::data
