#include "tessera/data/samples.h"

#include <algorithm>

#include "tessera/common/error.h"
#include "data/random.h"

namespace tessera::data {

namespace {
uint64_t epochKey(uint64_t seed, uint64_t salt, int64_t e, uint64_t what) {
  return mix64(mix64(seed ^ mix64(salt + 0x51ed2701ull)) ^ mix64(static_cast<uint64_t>(e) * 4 + what));
}
}  // namespace

DocumentSamples::DocumentSamples(std::shared_ptr<const TokenSource> src, int64_t firstDoc, int64_t endDoc,
                                 SampleOptions o, uint64_t salt)
    : src_(std::move(src)), first_(firstDoc), end_(endDoc), o_(o), salt_(salt) {
  TESSERA_CHECK(o_.seqLen >= 1, "tessera data: the sequence length must be >= 1, got {}", o_.seqLen);
  TESSERA_CHECK(first_ >= 0 && first_ < end_ && end_ <= src_->numDocuments(),
                "tessera data: no documents to sample from in {} (documents [{}, {}) of {})", src_->describe(), first_,
                end_, src_->numDocuments());
  length_.resize(end_ - first_);
  addEod_.resize(end_ - first_);
  for (int64_t d = first_; d < end_; ++d) {
    const int64_t len = src_->documentLength(d);
    bool add = false;
    if (o_.eodToken >= 0 && len > 0) {
      int64_t last;
      src_->read(d, len - 1, 1, &last);
      add = last != o_.eodToken;
    }
    addEod_[d - first_] = add;
    length_[d - first_] = len + add;
    tokens_ += len + add;
  }
  TESSERA_CHECK(tokens_ > o_.seqLen,
                "tessera data: a sample of sequence length {} needs {} tokens, but documents [{}, {}) of {} hold {}",
                o_.seqLen, o_.seqLen + 1, first_, end_, src_->describe(), tokens_);
  perEpoch_ = (tokens_ - 1) / o_.seqLen;
}

std::shared_ptr<const DocumentSamples::Epoch> DocumentSamples::epoch(int64_t e) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& r : recent_) {
    if (r && r->number == e) return r;
  }
  auto ep = std::make_shared<Epoch>();
  ep->number = e;
  const auto n = static_cast<int64_t>(length_.size());
  ep->order.resize(n);
  for (int64_t i = 0; i < n; ++i) ep->order[i] = i;
  Rng rng(epochKey(o_.seed, salt_, e, 0));
  for (int64_t i = n - 1; i > 0; --i) std::swap(ep->order[i], ep->order[rng.below(static_cast<uint64_t>(i) + 1)]);
  ep->start.resize(n + 1);
  ep->start[0] = 0;
  for (int64_t i = 0; i < n; ++i) ep->start[i + 1] = ep->start[i] + length_[ep->order[i]];
  recent_[1] = recent_[0];
  recent_[0] = ep;
  return ep;
}

template <typename F>
void DocumentSamples::walk(const Epoch& ep, int64_t t, int64_t n, F&& f) const {
  auto i = static_cast<size_t>(std::upper_bound(ep.start.begin(), ep.start.end(), t) - ep.start.begin()) - 1;
  while (n > 0) {
    const int64_t local = ep.order[i], offset = t - ep.start[i];
    const int64_t take = std::min(n, ep.start[i + 1] - t);
    const int64_t real = length_[local] - addEod_[local];  // tokens stored in the source
    const int64_t fromSource = std::max<int64_t>(0, std::min(take, real - offset));
    if (fromSource > 0) f(first_ + local, offset, fromSource, false);
    if (take > fromSource) f(first_ + local, real, int64_t{1}, true);
    t += take;
    n -= take;
    ++i;
  }
}

std::pair<const DocumentSamples::Epoch*, int64_t> DocumentSamples::locate(int64_t g,
                                                                         std::shared_ptr<const Epoch>& hold) const {
  TESSERA_CHECK(g >= 0, "tessera data: sample index {} is negative", g);
  const int64_t e = g / perEpoch_;
  hold = epoch(e);
  const Permutation perm(static_cast<uint64_t>(perEpoch_), epochKey(o_.seed, salt_, e, 1));
  return {hold.get(), static_cast<int64_t>(perm(static_cast<uint64_t>(g % perEpoch_))) * o_.seqLen};
}

void DocumentSamples::read(int64_t g, int64_t* out) const {
  std::shared_ptr<const Epoch> hold;
  const auto [ep, t] = locate(g, hold);
  walk(*ep, t, o_.seqLen + 1, [&](int64_t doc, int64_t offset, int64_t count, bool eod) {
    if (eod) {
      *out = o_.eodToken;
    } else {
      src_->read(doc, offset, count, out);
    }
    out += count;
  });
}

std::string DocumentSamples::where(int64_t g, int64_t j) const {
  std::shared_ptr<const Epoch> hold;
  const auto [ep, t] = locate(g, hold);
  std::string out;
  walk(*ep, t + j, 1, [&](int64_t doc, int64_t offset, int64_t, bool eod) {
    out = eod ? fmt::format("the end-of-document token appended to document {} of '{}'", doc, src_->path())
              : src_->where(doc, offset);
  });
  return out;
}

std::string DocumentSamples::describe() const {
  return fmt::format("documents [{}, {}) of {}: {} tokens, {} samples of {} + 1 per epoch", first_, end_,
                     src_->path(), tokens_, perEpoch_, o_.seqLen);
}

}  // namespace tessera::data
