#pragma once
// Deterministic randomness for the sample index (local): the same numbers on every rank,
// machine and compiler, so every rank derives the same shuffles with no communication
// (std::uniform_int_distribution is implementation-defined, hence these).
// - mix64: SplitMix64's finaliser, a bijective 64-bit mix.
// - Rng: SplitMix64 stream; below(n) is uniform in [0, n) (rejection, no modulo bias).
// - Permutation: a keyed pseudo-random bijection of [0, n) computed per index in O(1) memory
//   (a 6-round Feistel network over the next even power of two, cycle-walking into [0, n)).
#include <cstdint>

namespace tessera::data {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() { return mix64(s_ += 0x9e3779b97f4a7c15ull); }
  uint64_t below(uint64_t n) {  // n >= 1
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % n;
  }

 private:
  uint64_t s_;
};

class Permutation {
 public:
  Permutation(uint64_t n, uint64_t key) : n_(n) {
    int bits = 2;
    while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
    half_ = bits / 2;
    mask_ = (uint64_t{1} << half_) - 1;
    for (int r = 0; r < kRounds; ++r) keys_[r] = mix64(key + 0x632be59bd9b4e019ull * (r + 1));
  }
  uint64_t size() const { return n_; }
  // The image of i (i < size()).
  uint64_t operator()(uint64_t i) const {
    do i = encrypt(i);
    while (i >= n_);
    return i;
  }

 private:
  static constexpr int kRounds = 6;
  uint64_t encrypt(uint64_t x) const {
    uint64_t l = x >> half_, r = x & mask_;
    for (int k = 0; k < kRounds; ++k) {
      const uint64_t t = r;
      r = l ^ (mix64(r ^ keys_[k]) & mask_);
      l = t;
    }
    return (l << half_) | r;
  }
  uint64_t n_, mask_ = 0;
  int half_ = 1;
  uint64_t keys_[kRounds]{};
};

}  // namespace tessera::data
