// src/data sampling: the seeded permutation is a bijection; samples pack documents across
// boundaries with end-of-document tokens where missing, and every sample of an epoch is seen
// once; blends keep their weights; splits are disjoint; global batches are the same for dp 1,
// 2 and 4, resumed (also under another dp) or not; the loader thread gives the same batches and
// passes errors on; a checkpoint's data state refuses other data.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "tessera/common/error.h"
#include "tessera/data/batch.h"
#include "tessera/data/dataset.h"
#include "tessera/data/loader.h"
#include "data/random.h"
#include "writers.h"

using namespace tessera;
using namespace tessera::data;
using namespace tessera::testing;
namespace fs = std::filesystem;

namespace {

class Sampling : public DataDirTest {
 protected:
  // `n` documents; document d holds tokens d·1000 + 1, + 2, ... (lengths 1..maxLen, seeded), so
  // a token names its document and position. With `eod` > 0 every other document ends in it.
  std::string corpus(const std::string& name, int n, int maxLen, int64_t eod = -1, uint64_t seed = 5) {
    Docs docs;
    Rng rng(seed);
    for (int d = 0; d < n; ++d) {
      std::vector<int64_t> doc;
      const auto len = 1 + static_cast<int64_t>(rng.below(maxLen));
      for (int64_t i = 0; i < len; ++i) doc.push_back(d * 1000 + i + 1);
      if (eod > 0 && d % 2 == 0) doc.push_back(eod);
      docs.push_back(doc);
    }
    writeMegatron(path(name), docs, 4);
    return path(name);
  }
};

std::vector<int64_t> sample(const DocumentSamples& s, int64_t g) {
  std::vector<int64_t> out(s.seqLen() + 1);
  s.read(g, out.data());
  return out;
}

TEST(Permutation, IsABijectionAndDependsOnTheKey) {
  for (uint64_t n : {1u, 2u, 3u, 5u, 17u, 1000u, 4097u, 65536u}) {
    Permutation p(n, 99);
    std::vector<uint8_t> seen(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t j = p(i);
      ASSERT_LT(j, n);
      ASSERT_FALSE(seen[j]) << "n " << n << " hits " << j << " twice";
      seen[j] = 1;
    }
  }
  Permutation a(1000, 1), b(1000, 2);
  int same = 0, fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same += a(i) == b(i);
    fixed += a(i) == i;
  }
  EXPECT_LT(same, 20);
  EXPECT_LT(fixed, 20);
}

TEST(Rng, BelowIsUniformEnough) {
  Rng r(3);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) ++counts[r.below(7)];
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

TEST_F(Sampling, EverySampleOfAnEpochOnceAcrossDocumentBoundaries) {
  auto src = openTokenSource(corpus("c", 40, 30));
  const int64_t T = 16;
  DocumentSamples s(src, 0, src->numDocuments(), {T, 7, -1});
  EXPECT_EQ(s.tokensPerEpoch(), src->numTokens());
  EXPECT_EQ(s.samplesPerEpoch(), (src->numTokens() - 1) / T);
  const int64_t n = s.samplesPerEpoch();
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    // The inputs of an epoch's samples cover n·T distinct tokens; each sample's tokens follow
    // each other in a document, or start the next one (packing across boundaries).
    std::set<int64_t> tokens;
    int crossings = 0;
    for (int64_t g = epoch * n; g < (epoch + 1) * n; ++g) {
      const auto x = sample(s, g);
      for (int64_t j = 0; j < T; ++j) {
        EXPECT_TRUE(tokens.insert(x[j]).second) << "token " << x[j] << " twice in epoch " << epoch;
        const bool next = x[j + 1] == x[j] + 1, fresh = x[j + 1] % 1000 == 1;
        EXPECT_TRUE(next || fresh) << x[j] << " then " << x[j + 1];
        crossings += !next;
      }
    }
    EXPECT_EQ(static_cast<int64_t>(tokens.size()), n * T);
    EXPECT_GT(crossings, 0);
  }
  // Epochs shuffle differently; the same options give the same samples (no state).
  DocumentSamples again(src, 0, src->numDocuments(), {T, 7, -1});
  int differ = 0;
  for (int64_t g = 0; g < n; ++g) {
    EXPECT_EQ(sample(s, g), sample(again, g));
    differ += sample(s, g) != sample(s, g + n);
  }
  EXPECT_GT(differ, n / 2);
  DocumentSamples otherSeed(src, 0, src->numDocuments(), {T, 8, -1});
  EXPECT_NE(sample(s, 0), sample(otherSeed, 0));
}

TEST_F(Sampling, EndOfDocumentTokenAppendedWhereMissing) {
  const int64_t eod = 999;
  auto src = openTokenSource(corpus("c", 30, 9, eod));
  DocumentSamples s(src, 0, src->numDocuments(), {8, 1, eod});
  int64_t added = 0;
  for (int64_t d = 0; d < src->numDocuments(); ++d) added += d % 2 == 1;
  EXPECT_EQ(s.tokensPerEpoch(), src->numTokens() + added);
  // Every document's last token is followed by exactly one eod (none doubled), every eod by a
  // document's first token.
  int eods = 0;
  for (int64_t g = 0; g < s.samplesPerEpoch(); ++g) {
    const auto x = sample(s, g);
    for (size_t j = 0; j + 1 < x.size(); ++j) {
      if (x[j] == eod) {
        ++eods;
        EXPECT_EQ(x[j + 1] % 1000, 1) << "after an eod at sample " << g;
      } else {
        EXPECT_TRUE(x[j + 1] == x[j] + 1 || x[j + 1] == eod) << x[j] << " then " << x[j + 1];
      }
    }
  }
  EXPECT_GT(eods, 10);
  const auto first = sample(s, 0);
  const int64_t j = first[0] == eod ? 1 : 0;
  EXPECT_NE(s.where(0, j).find(fmt::format("sequence {} position {}", first[j] / 1000, first[j] % 1000 - 1)),
            std::string::npos)
      << s.where(0, j);
}

TEST_F(Sampling, TooShortOrEmptyDataIsAnError) {
  auto src = openTokenSource(corpus("c", 3, 4));
  expectError([&] { DocumentSamples s(src, 0, 3, {64, 1, -1}); },
              {"sequence length 64 needs 65 tokens", "documents [0, 3)", path("c")});
  expectError([&] { DocumentSamples s(src, 2, 2, {4, 1, -1}); }, {"no documents to sample from"});
  writeMegatron(path("empty"), {});
  expectError([&] { DocumentSamples s(openTokenSource(path("empty")), 0, 0, {4, 1, -1}); }, {"no documents"});
}

TEST_F(Sampling, BlendKeepsItsWeightsAndSeeksExactly) {
  std::vector<std::shared_ptr<const DocumentSamples>> parts;
  for (int j = 0; j < 3; ++j) {
    auto src = openTokenSource(corpus(fmt::format("c{}", j), 20, 40, -1, 10 + j));
    parts.push_back(std::make_shared<DocumentSamples>(src, 0, src->numDocuments(), SampleOptions{8, 3, -1}, j));
  }
  const std::vector<double> w = {0.5, 0.3, 0.2};
  Blend b(parts, {5, 3, 2});
  const int64_t n = 20000;
  const auto all = b.locate(0, n);
  std::vector<int64_t> taken(3, 0);
  for (int64_t g = 0; g < n; ++g) {
    const auto [j, c] = all[g];
    EXPECT_EQ(c, taken[j]) << "part " << j << " skips or repeats a sample at " << g;
    ++taken[j];
    for (int k = 0; k < 3; ++k) ASSERT_LE(std::abs(taken[k] - w[k] * (g + 1)), 2.0) << "prefix " << g + 1;
  }
  // Seeking (past a mark, inside one) gives what a walk from 0 gives.
  for (int64_t first : {int64_t{0}, int64_t{8191}, int64_t{8192}, int64_t{12345}, int64_t{19990}}) {
    const auto got = b.locate(first, 10);
    for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(got[i], all[first + i]) << first + i;
  }
  std::vector<int64_t> row(9), direct(9);
  b.read(12345, 1, row.data());
  parts[all[12345].first]->read(all[12345].second, direct.data());
  EXPECT_EQ(row, direct);
}

TEST_F(Sampling, SplitIsDisjointByDocumentsAndSpecsAreChecked) {
  const auto c = corpus("c", 100, 20);
  DataOptions o;
  o.train = c;
  o.split = "98,2";
  o.seqLen = 4;
  GptData data(o);
  ASSERT_NE(data.valid(), nullptr);
  std::set<int64_t> trainDocs, validDocs;
  auto docsOf = [](const Blend& b, int64_t n, std::set<int64_t>& out) {
    std::vector<int64_t> x(n * 5);
    b.read(0, n, x.data());
    for (int64_t t : x) out.insert(t / 1000);
  };
  docsOf(data.train(), 3 * data.train().part(0).samplesPerEpoch(), trainDocs);
  docsOf(*data.valid(), 3 * data.valid()->part(0).samplesPerEpoch(), validDocs);
  EXPECT_EQ(trainDocs.size(), 98u);
  EXPECT_EQ(validDocs, (std::set<int64_t>{98, 99}));
  // A blend of two paths with weights; the validation share of each.
  o.train = fmt::format("0.7 {} 0.3 {}", c, corpus("d", 50, 20));
  GptData blend(o);
  EXPECT_EQ(blend.train().numParts(), 2u);
  EXPECT_NEAR(blend.train().weight(0), 0.7, 1e-12);
  EXPECT_EQ(blend.valid()->numParts(), 2u);
  EXPECT_NE(blend.describe().find("validation (weight 0.3)"), std::string::npos) << blend.describe();
  // Errors.
  o.train = c;
  o.split = "100,0.1";
  expectError([&] { GptData d(o); }, {"validation share of split '100,0.1' holds no document", c});
  o.split = "98;2";
  expectError([&] { GptData d(o); }, {"split '98;2'", "'98;2' is not a share"});
  o.split = "0,0";
  expectError([&] { GptData d(o); }, {"summing to > 0"});
  o.split = "0,100";
  expectError([&] { GptData d(o); }, {"training share", "holds no document"});
  expectError([&] { parseBlend("0.7 a b"); }, {"blend '0.7 a b' must alternate weight and path"});
  expectError([&] { parseBlend("0.7 a x b"); }, {"'x' is not a weight > 0 (for 'b')"});
  expectError([&] { parseBlend("-1 a 2 b"); }, {"'-1' is not a weight > 0"});
  expectError([&] { parseBlend("a 0.5"); }, {"weight '0.5' has no dataset before it"});
  EXPECT_EQ(parseBlend("a b").weights, (std::vector<double>{1, 1}));
}

// The rows of a global batch read by dp ranks, concatenated.
at::Tensor globalBatchByRanks(const Blend& b, int64_t step, int64_t B, int dp, int64_t vocab) {
  std::vector<at::Tensor> rows;
  for (int r = 0; r < dp; ++r) rows.push_back(readSamples(b, step * B + r * B / dp, B / dp, vocab));
  return at::cat(rows);
}

TEST_F(Sampling, GlobalBatchesIndependentOfDpAndResume) {
  DataOptions o;
  o.train = fmt::format("2 {} 1 {}", corpus("c", 60, 50), corpus("d", 60, 50));
  o.seqLen = 12;
  o.seed = 11;
  GptData data(o);
  const int64_t B = 8, vocab = 100000;
  for (int64_t step : {0, 1, 7, 40}) {
    auto one = globalBatchByRanks(data.train(), step, B, 1, vocab);
    EXPECT_TRUE(at::equal(one, globalBatchByRanks(data.train(), step, B, 2, vocab)));
    EXPECT_TRUE(at::equal(one, globalBatchByRanks(data.train(), step, B, 4, vocab)));
    EXPECT_TRUE(at::equal(one, globalBatchByRanks(GptData(o).train(), step, B, 4, vocab))) << "a fresh build differs";
  }
  // Loaders: an uninterrupted run of 6 steps on dp 2, against one resumed at step 3 on dp 4.
  auto dataPtr = std::make_shared<GptData>(o);
  std::shared_ptr<const Blend> train(dataPtr, &dataPtr->train());
  std::vector<at::Tensor> straight, resumed;
  {
    std::vector<std::unique_ptr<BatchLoader>> ranks;
    for (int r = 0; r < 2; ++r) ranks.push_back(std::make_unique<BatchLoader>(train, LoaderOptions{B, r * 4, 4, vocab}, 0));
    for (int s = 0; s < 6; ++s) {
      std::vector<at::Tensor> rows;
      for (auto& l : ranks) {
        auto b = l->next();
        EXPECT_TRUE(at::equal(b.tokens.narrow(1, 1, 11), b.targets.narrow(1, 0, 11)));
        rows.push_back(at::cat({b.tokens, b.targets.narrow(1, 11, 1)}, 1));
      }
      straight.push_back(at::cat(rows));
    }
  }
  std::vector<std::unique_ptr<BatchLoader>> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(std::make_unique<BatchLoader>(train, LoaderOptions{B, r * 2, 2, vocab}, 3 * B));
  for (int s = 3; s < 6; ++s) {
    std::vector<at::Tensor> rows;
    for (auto& l : ranks) {
      auto b = l->next();
      rows.push_back(at::cat({b.tokens, b.targets.narrow(1, 11, 1)}, 1));
    }
    EXPECT_TRUE(at::equal(at::cat(rows), straight[s])) << "step " << s;
    EXPECT_TRUE(at::equal(straight[s], globalBatchByRanks(data.train(), s, B, 1, vocab)));
  }
}

TEST_F(Sampling, TokenOutsideTheVocabularyIsNamedAndPassedOnByTheLoader) {
  DataOptions o;
  o.train = corpus("c", 10, 30);
  o.seqLen = 8;
  auto data = std::make_shared<GptData>(o);
  std::shared_ptr<const Blend> train(data, &data->train());
  // Tokens are d·1000 + i: a vocabulary of 5000 holds documents 0-4 only.
  expectError([&] {
    for (int64_t s = 0; s < 20; ++s) readSamples(*train, s * 4, 4, 5000);
  },
              {"outside the model's vocabulary [0, 5000)", path("c.bin"), "sequence", "position", "(document"});
  BatchLoader loader(train, LoaderOptions{4, 0, 4, 5000}, 0);
  expectError([&] {
    for (int s = 0; s < 20; ++s) loader.next();
  },
              {"outside the model's vocabulary"});
}

TEST_F(Sampling, DataStateRefusesOtherData) {
  DataOptions o;
  o.train = corpus("c", 10, 30);
  o.seqLen = 8;
  const DataState here{24, GptData(o).fingerprint(), "c"};
  const auto back = decodeDataState(encodeDataState(here));
  EXPECT_EQ(back.consumedSamples, 24);
  EXPECT_EQ(back.fingerprint, here.fingerprint);
  EXPECT_EQ(back.description, "c");
  EXPECT_EQ(resumePosition(back, here), 24);
  DataOptions same = o;
  same.split = "100,0";  // the same training documents, written otherwise
  EXPECT_EQ(GptData(same).fingerprint(), here.fingerprint);
  for (auto change : std::vector<std::function<void(DataOptions&)>>{
           [](DataOptions& x) { x.seed = 2; }, [](DataOptions& x) { x.seqLen = 9; },
           [](DataOptions& x) { x.split = "5,5"; }, [&](DataOptions& x) { x.train = corpus("other", 10, 30, -1, 6); }}) {
    DataOptions other = o;
    change(other);
    const DataState there{0, GptData(other).fingerprint(), "other data"};
    expectError([&] { resumePosition(back, there); }, {"other data than this run is given", "checkpoint: c"});
  }
  expectError([&] { decodeDataState("samples=x"); }, {"malformed data state 'samples=x'"});
}

}  // namespace
