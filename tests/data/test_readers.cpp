// src/data readers: Megatron indexed datasets, llm.c shards and raw token files written byte by
// byte by tests/data/writers.h are read back exactly; every malformed file is an error naming
// the file and what is wrong.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "tessera/common/error.h"
#include "data/megatron.h"
#include "data/token_stream.h"
#include "writers.h"

using namespace tessera;
using namespace tessera::data;
using namespace tessera::testing;
namespace fs = std::filesystem;

namespace {

using Readers = DataDirTest;

std::vector<int64_t> toVector(const at::Tensor& t) { return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()}; }

const Docs kSeqs = {{1, 2, 3}, {}, {65535, 0, 7, 9}, {42}, {5, 6}};

TEST_F(Readers, MegatronBothDtypesReadBack) {
  for (int code : {8, 4}) {
    Docs seqs = kSeqs;
    if (code == 4) seqs[2] = {2000000000, 0, 7, 70000};
    writeMegatron(path("m"), seqs, code, {2, 2, 5});  // documents: [0,2), [2,2) empty, [2,5)
    for (const std::string given : {path("m"), path("m.idx"), path("m.bin")}) {
      IndexedDataset ds(given);
      EXPECT_EQ(ds.tokenType(), code == 8 ? TokenType::UInt16 : TokenType::Int32);
      ASSERT_EQ(ds.numSequences(), 5);
      for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(toVector(ds.sequence(i)), seqs[i]) << "sequence " << i;
      EXPECT_EQ(toVector(ds.documentIndices()), (std::vector<int64_t>{0, 2, 2, 5}));
      EXPECT_EQ(ds.splitPoints(), (std::vector<int64_t>{0, 2}));
      EXPECT_EQ(ds.numTokens(), 10);
      int64_t two[2];
      ds.read(2, 1, 2, two);
      EXPECT_EQ(two[0], seqs[2][1]);
      EXPECT_EQ(two[1], seqs[2][2]);
      EXPECT_NE(ds.where(3, 0).find("sequence 3 position 0 (document 2)"), std::string::npos) << ds.where(3, 0);
    }
  }
}

TEST_F(Readers, MegatronFingerprintFollowsContent) {
  writeMegatron(path("a"), kSeqs);
  writeMegatron(path("b"), kSeqs);
  auto other = kSeqs;
  other[4][1] = 8;
  writeMegatron(path("c"), other);
  EXPECT_EQ(IndexedDataset(path("a")).fingerprint(), IndexedDataset(path("b")).fingerprint());
  EXPECT_NE(IndexedDataset(path("a")).fingerprint(), IndexedDataset(path("c")).fingerprint());
}

// Rewrites byte `at` of a file (or truncates / extends it) and expects the error parts.
TEST_F(Readers, MegatronBadIndexNamesFileAndProblem) {
  const std::string idx = path("m.idx");
  auto corrupt = [&](const std::function<void(std::string&)>& edit, std::initializer_list<std::string> parts) {
    writeMegatron(path("m"), kSeqs);
    auto bytes = readFile(idx);
    edit(bytes);
    writeFile(idx, bytes);
    expectError([&] { IndexedDataset ds(path("m")); }, parts);
  };
  corrupt([](std::string& b) { b[0] = 'X'; }, {idx, "wrong magic"});
  corrupt([](std::string& b) { b[9] = 2; }, {idx, "unknown index version 2"});
  corrupt([](std::string& b) { b[17] = 6; }, {idx, "unsupported token dtype code 6 (float64)"});
  corrupt([](std::string& b) { b[17] = 1; }, {idx, "code 1 (uint8)"});
  corrupt([](std::string& b) { b[17] = 99; }, {idx, "code 99 (unknown)"});
  corrupt([](std::string& b) { b.resize(20); }, {idx, "truncated: 20 bytes"});
  corrupt([](std::string& b) { b.resize(b.size() - 8); }, {idx, "truncated"});
  corrupt([](std::string& b) { b += "12345678"; }, {idx, "counts do not add up"});
  corrupt([](std::string& b) { b[18] = 100; }, {idx, "100 sequences"});
  // Sequence 2's pointer (int64 at 34 + 4·5 + 8·2) beyond the .bin, and misaligned.
  corrupt([](std::string& b) { b[34 + 20 + 16] = 100; }, {idx, "sequence 2", "outside the .bin of 20 bytes"});
  corrupt([](std::string& b) { b[34 + 20 + 16] = 5; }, {idx, "sequence 2", "not aligned"});
  // Sequence 0's length made negative.
  corrupt([](std::string& b) { b[34 + 3] = '\x80'; }, {idx, "sequence 0"});
  // Document indices: first not 0; decreasing; last not S.
  const size_t docs = 34 + 12 * 5;
  corrupt([&](std::string& b) { b[docs] = 1; }, {idx, "must start at 0"});
  corrupt([&](std::string& b) { b[docs + 8 * 3] = 1; }, {idx, "document index 3 is 1 after"});
  corrupt([&](std::string& b) { b[docs + 8 * 5] = 4; }, {idx, "last document index is 4, not the sequence count 5"});
}

TEST_F(Readers, MegatronTruncatedOrMissingBin) {
  writeMegatron(path("m"), kSeqs);
  auto bin = readFile(path("m.bin"));
  writeFile(path("m.bin"), bin.substr(0, bin.size() - 2));
  expectError([&] { IndexedDataset ds(path("m")); }, {path("m.idx"), "sequence 4", "outside the .bin of 18 bytes"});
  fs::remove(path("m.bin"));
  expectError([&] { IndexedDataset ds(path("m")); }, {path("m.bin"), "cannot open"});
  expectError([&] { IndexedDataset ds(path("nothing")); }, {path("nothing.idx"), "cannot open"});
}

// A .bin of another, larger dataset beside this .idx: every sequence lies inside it, yet the pair
// is refused (it trained on 1 % of the file before, issue 52).
TEST_F(Readers, MegatronBinOfAnotherDataset) {
  writeMegatron(path("m"), kSeqs);
  Docs more = kSeqs;
  for (int k = 0; k < 3; ++k) more.insert(more.end(), kSeqs.begin(), kSeqs.end());
  writeMegatron(path("other"), more);
  fs::copy_file(path("other.bin"), path("m.bin"), fs::copy_options::overwrite_existing);
  expectError([&] { IndexedDataset ds(path("m")); },
              {path("m.idx"), "describes 20 bytes of tokens, but its .bin has 80", "different datasets"});
}

TEST_F(Readers, LlmcShardsReadAsOneStream) {
  // Shard 1 empty; documents end at 0 and one spans shards 2 and 3.
  writeLlmc(path("s_000.bin"), {0, 11, 12, 0});
  writeLlmc(path("s_001.bin"), {});
  writeLlmc(path("s_002.bin"), {13, 14});
  writeLlmc(path("s_003.bin"), {15, 0, 16});
  TokenStream one(path("s_*.bin"), Format::Llmc);
  EXPECT_EQ(one.files().size(), 4u);
  EXPECT_EQ(one.numDocuments(), 1);
  EXPECT_EQ(toVector(one.tokens(0, 9)), (std::vector<int64_t>{0, 11, 12, 0, 13, 14, 15, 0, 16}));
  TokenStream docs(path("s_*.bin"), Format::Llmc, /*eodToken=*/0);
  ASSERT_EQ(docs.numDocuments(), 4);
  const std::vector<int64_t> lengths = {1, 3, 4, 1};
  for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(docs.documentLength(d), lengths[d]);
  int64_t spanning[4];
  docs.read(2, 0, 4, spanning);
  EXPECT_EQ(std::vector<int64_t>(spanning, spanning + 4), (std::vector<int64_t>{13, 14, 15, 0}));
  EXPECT_NE(docs.where(2, 2).find("s_003.bin' token 0 (document 2 position 2)"), std::string::npos)
      << docs.where(2, 2);
  // uint32 (Llama 3) shards.
  writeLlmc(path("w_000.bin"), {128000, 5, 128255}, /*wide=*/true);
  TokenStream wide(path("w_000.bin"), Format::Llmc);
  EXPECT_EQ(wide.tokenType(), TokenType::UInt32);
  EXPECT_EQ(toVector(wide.tokens(0, 3)), (std::vector<int64_t>{128000, 5, 128255}));
  expectError([&] { TokenStream s(path("*.bin"), Format::Llmc); }, {"w_000.bin", "holds uint32 tokens"});
}

TEST_F(Readers, LlmcBadHeaderNamesFileAndProblem) {
  const std::string f = path("s.bin");
  writeLlmc(f, {1, 2, 3}, false, 4);
  expectError([&] { TokenStream s(f, Format::Llmc); }, {f, "says 4 uint16 tokens", "truncated"});
  writeLlmc(f, {1, 2, 3}, false, 2);
  expectError([&] { TokenStream s(f, Format::Llmc); }, {f, "trailing bytes"});
  writeLlmc(f, {1, 2, 3});
  auto b = readFile(f);
  b[4] = 7;
  writeFile(f, b);
  expectError([&] { TokenStream s(f, Format::Llmc); }, {f, "unknown llm.c version 7 for magic 20240520"});
  b[0] = 1;
  writeFile(f, b);
  expectError([&] { TokenStream s(f, Format::Llmc); }, {f, "not an llm.c token shard"});
  writeFile(f, b.substr(0, 100));
  expectError([&] { TokenStream s(f, Format::Llmc); }, {f, "truncated: 100 bytes"});
  expectError([&] { TokenStream s(path("none_*.bin"), Format::Llmc); }, {"no file matches", "none_*.bin"});
}

TEST_F(Readers, RawFilesAndAutoDetection) {
  writeRaw(path("train.bin"), {3, 1, 4, 1, 5}, false);
  TokenStream raw(path("train.bin"), Format::RawUInt16);
  EXPECT_EQ(toVector(raw.tokens(1, 4)), (std::vector<int64_t>{1, 4, 1, 5}));
  writeRaw(path("wide.bin"), {70000, 2}, true);
  EXPECT_EQ(toVector(TokenStream(path("wide.bin"), Format::RawUInt32).tokens(0, 2)), (std::vector<int64_t>{70000, 2}));
  expectError([&] { TokenStream s(path("train.bin"), Format::RawUInt32); }, {"train.bin", "10 bytes", "uint32"});
  expectError([&] { raw.tokens(3, 3); }, {"tokens [3, 6) out of range of the 5 tokens"});
  // Auto: Megatron by its .idx, llm.c by its magic, raw refused with advice.
  writeMegatron(path("m"), kSeqs);
  EXPECT_NE(openTokenSource(path("m"))->describe().find("megatron uint16"), std::string::npos);
  writeLlmc(path("s_000.bin"), {1, 2});
  EXPECT_NE(openTokenSource(path("s_*.bin"))->describe().find("llmc uint16"), std::string::npos);
  expectError([&] { openTokenSource(path("train.bin")); }, {"cannot tell the format", "raw-uint16 or raw-uint32"});
  expectError([&] { parseFormat("parquet"); }, {"unknown data format 'parquet'"});
  expectError([&] { openTokenSource(path("nothing")); }, {"no dataset at", path("nothing.idx"), "no file matching"});
}

}  // namespace
