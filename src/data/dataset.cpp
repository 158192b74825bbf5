#include "tessera/data/dataset.h"

#include <cmath>
#include <sstream>

#include "tessera/common/error.h"
#include "data/random.h"

namespace tessera::data {

namespace {
bool parseNumber(const std::string& s, double& out) {
  try {
    size_t n = 0;
    out = std::stod(s, &n);
    return n == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

// Documents [begin, end) of each share, cut at split points (Megatron's rounding).
std::vector<std::pair<int64_t, int64_t>> shareRanges(const TokenSource& src, const std::vector<double>& shares) {
  const auto points = src.splitPoints();
  const auto n = static_cast<int64_t>(points.size());
  auto doc = [&](int64_t i) { return i >= n ? src.numDocuments() : points[i]; };
  std::vector<std::pair<int64_t, int64_t>> out;
  double cum = 0;
  int64_t at = 0;
  for (size_t k = 0; k < shares.size(); ++k) {
    cum += shares[k];
    const int64_t next = k + 1 == shares.size() ? n : std::min<int64_t>(n, std::llround(cum * n));
    out.emplace_back(doc(at), doc(next));
    at = next;
  }
  return out;
}
}  // namespace

BlendSpec parseBlend(const std::string& spec) {
  std::vector<std::string> words;
  std::istringstream in(spec);
  for (std::string w; in >> w;) words.push_back(w);
  TESSERA_CHECK(!words.empty(), "tessera data: the data spec is empty");
  BlendSpec b;
  double w = 0;
  if (!parseNumber(words[0], w)) {  // paths only: equal weights
    for (const auto& p : words) {
      TESSERA_CHECK(!parseNumber(p, w), "tessera data: blend '{}': weight '{}' has no dataset before it", spec, p);
      b.paths.push_back(p);
      b.weights.push_back(1.0);
    }
    return b;
  }
  TESSERA_CHECK(words.size() % 2 == 0, "tessera data: blend '{}' must alternate weight and path (W1 PATH1 W2 PATH2 ...)",
                spec);
  for (size_t i = 0; i < words.size(); i += 2) {
    TESSERA_CHECK(parseNumber(words[i], w) && w > 0 && std::isfinite(w),
                  "tessera data: blend '{}': '{}' is not a weight > 0 (for '{}')", spec, words[i], words[i + 1]);
    b.weights.push_back(w);
    b.paths.push_back(words[i + 1]);
  }
  return b;
}

std::vector<double> parseSplit(const std::string& split) {
  std::vector<double> out;
  std::stringstream ss(split);
  double sum = 0;
  for (std::string item; std::getline(ss, item, ',');) {
    double x = 0;
    TESSERA_CHECK(parseNumber(item, x) && x >= 0 && std::isfinite(x),
                  "tessera data: split '{}': '{}' is not a share >= 0 (e.g. 98,2 or 969,30,1)", split, item);
    out.push_back(x);
    sum += x;
  }
  TESSERA_CHECK(!out.empty() && out.size() <= 3 && sum > 0,
                "tessera data: split '{}' needs 1 to 3 shares (training, validation, test) summing to > 0", split);
  for (auto& x : out) x /= sum;
  return out;
}

GptData::GptData(const DataOptions& o) : o_(o) {
  const auto shares = parseSplit(o.split);
  const SourceOptions so{o.format, o.eodToken};
  const SampleOptions sample{o.seqLen, o.seed, o.eodToken};
  uint64_t h = mix64(o.seed ^ mix64(static_cast<uint64_t>(o.seqLen))) + o.eodToken;
  auto build = [&](const std::string& spec, int share, bool whole) {
    const auto b = parseBlend(spec);
    std::vector<std::shared_ptr<const DocumentSamples>> parts;
    for (size_t j = 0; j < b.paths.size(); ++j) {
      auto src = openTokenSource(b.paths[j], so);
      int64_t first = 0, end = src->numDocuments();
      if (!whole) std::tie(first, end) = shareRanges(*src, shares)[share];
      if (share == 0) {
        h = mix64(h ^ src->fingerprint()) + static_cast<uint64_t>(b.weights[j] * 1e9);
        h = mix64(h ^ static_cast<uint64_t>(first)) + static_cast<uint64_t>(end);
      }
      const char* what = share == 0 ? "training" : "validation";
      TESSERA_CHECK(end > first, "tessera data: the {} share of split '{}' holds no document of {}", what, o.split,
                    src->describe());
      parts.push_back(std::make_shared<DocumentSamples>(src, first, end, sample, j * 2 + share));
      lines_.push_back(fmt::format("{} (weight {:.3g}): {}", what, b.weights[j], parts.back()->describe()));
    }
    return std::make_unique<Blend>(std::move(parts), b.weights);
  };
  train_ = build(o.train, 0, false);
  if (!o.valid.empty()) {
    valid_ = build(o.valid, 1, true);
  } else if (shares.size() > 1 && shares[1] > 0) {
    valid_ = build(o.train, 1, false);
  }
  fingerprint_ = h;
}

std::string GptData::describe() const {
  std::string out;
  for (const auto& l : lines_) out += (out.empty() ? "" : "\n") + l;
  return out;
}

}  // namespace tessera::data
