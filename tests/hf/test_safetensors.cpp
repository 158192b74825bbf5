// src/hf: safetensors files and checkpoints written by tessera read back exactly (every dtype,
// metadata, views over the mapping, slices); sharded checkpoints split at the size limit with
// Hugging Face's names and index.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tessera/hf/safetensors.h"
#include "hf_testing.h"

using namespace tessera;
using namespace tessera::hf;
using namespace tessera::testing;
namespace fs = std::filesystem;

namespace {

using Safetensors = HfDir;

const std::vector<std::pair<DType, at::ScalarType>> kTypes = {
    {DType::F32, at::kFloat}, {DType::BF16, at::kBFloat16}, {DType::F16, at::kHalf}, {DType::F64, at::kDouble},
    {DType::I64, at::kLong},  {DType::I32, at::kInt},       {DType::I16, at::kShort}, {DType::I8, at::kChar},
    {DType::U8, at::kByte},   {DType::Bool, at::kBool}};

// One tensor of every dtype (odd sizes, so that a careless layout would misalign), a scalar and
// an empty tensor.
NamedTensors everyDType() {
  NamedTensors out;
  for (const auto& [d, type] : kTypes) {
    const std::string name = std::string("t.") + dtypeName(d);
    out.emplace_back(name, pattern(name, type, {3, 5}));
  }
  out.emplace_back("scalar", pattern("scalar", at::kFloat, {}));
  out.emplace_back("empty", pattern("empty", at::kBFloat16, {0, 4}));
  return out;
}

TEST_F(Safetensors, EveryDTypeRoundTrips) {
  const auto tensors = everyDType();
  writeSafetensors(path("m.safetensors"), tensors, {{"step", "7"}});
  SafetensorsFile f(path("m.safetensors"));
  EXPECT_EQ(f.metadata(), (Metadata{{"format", "pt"}, {"step", "7"}}));
  EXPECT_EQ(f.header().dataStart % 8, 0u);
  ASSERT_EQ(f.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const at::Tensor back = f.get(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::equal(back, t)) << name;
    EXPECT_EQ(scalarType(f.entry(name).dtype), t.scalar_type()) << name;
    // Aligned by the writer: every read is a view of the mapping, not a copy.
    if (t.numel() > 0) EXPECT_EQ(f.get(name).data_ptr(), back.data_ptr()) << name;
  }
  // Largest elements first.
  EXPECT_EQ(f.header().tensors.front().dtype, DType::F64);
  EXPECT_EQ(f.header().tensors.back().dtype, DType::Bool);
}

TEST_F(Safetensors, TensorsOutliveTheReaderAndNeverWriteTheFile) {
  const at::Tensor w = pattern("w", at::kFloat, {4, 4});
  writeSafetensors(path("m.safetensors"), {{"w", w}});
  const auto before = readFile(path("m.safetensors"));
  at::Tensor view;
  {
    SafetensorsFile f(path("m.safetensors"));
    view = f.get("w");
  }
  EXPECT_TRUE(at::equal(view, w));  // the mapping lives as long as the tensor
  view.add_(1);                     // copy-on-write: the process's own pages
  EXPECT_TRUE(at::equal(view, w + 1));
  EXPECT_EQ(readFile(path("m.safetensors")), before);
  EXPECT_TRUE(at::equal(SafetensorsFile(path("m.safetensors")).get("w"), w));
}

TEST_F(Safetensors, SlicesAreRowsAndColumns) {
  for (auto type : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor w = pattern("w", type, {6, 8}), b = pattern("b", type, {6});
    writeSafetensors(path("m.safetensors"), {{"w", w}, {"b", b}});
    SafetensorsFile f(path("m.safetensors"));
    EXPECT_TRUE(at::equal(f.slice("w", {2, 5}, {3, 7}), w.narrow(0, 2, 3).narrow(1, 3, 4)));
    EXPECT_TRUE(at::equal(f.slice("w", {4, Range::kAll}), w.narrow(0, 4, 2)));
    EXPECT_TRUE(at::equal(f.slice("w", {}, {0, 4}), w.narrow(1, 0, 4)));
    EXPECT_TRUE(at::equal(f.slice("w", {3, 3}), w.narrow(0, 3, 0)));
    EXPECT_TRUE(at::equal(f.slice("b", {1, 4}), b.narrow(0, 1, 3)));
    // Every tensor-parallel shard of 4 ranks, column- and row-parallel, together make the tensor.
    std::vector<at::Tensor> rows, cols;
    for (int r = 0; r < 2; ++r) rows.push_back(f.slice("w", {3 * r, 3 * r + 3}));
    for (int r = 0; r < 4; ++r) cols.push_back(f.slice("w", {}, {2 * r, 2 * r + 2}));
    EXPECT_TRUE(at::equal(at::cat(rows, 0), w));
    EXPECT_TRUE(at::equal(at::cat(cols, 1), w));
  }
  SafetensorsFile f(path("m.safetensors"));
  const std::string file = path("m.safetensors");
  expectError([&] { f.slice("w", {4, 7}); }, {file, "tensor 'w' of shape [6, 8]", "rows [4, 7) is not inside [0, 6)"});
  expectError([&] { f.slice("w", {-1, 2}); }, {file, "'w'", "rows [-1, 2)"});
  expectError([&] { f.slice("w", {}, {5, 3}); }, {file, "'w'", "columns [5, 3)"});
  expectError([&] { f.slice("b", {}, {0, 1}); }, {file, "tensor 'b' of shape [6] has no dimension 1"});
  expectError([&] { f.get("nope"); }, {file, "has no tensor 'nope'"});
}

TEST_F(Safetensors, ShardsAtTheSizeLimitWithAnIndex) {
  NamedTensors tensors;
  for (int i = 0; i < 6; ++i) {
    const std::string name = "layers." + std::to_string(i) + ".w";
    tensors.emplace_back(name, pattern(name, i % 2 ? at::kBFloat16 : at::kFloat, {4, 8}));  // 128 or 64 bytes
  }
  tensors.emplace_back("big", pattern("big", at::kFloat, {100}));  // 400 bytes, over the limit: a file to itself
  tensors.emplace_back("tail", pattern("tail", at::kHalf, {2}));
  WriteOptions o;
  o.maxShardBytes = 200;
  const auto files = writeCheckpoint(path("ckpt"), tensors, {{"k", "v"}}, o);
  // 128+64 | 128+64 | 128+64 | 400 | 4
  const std::vector<std::string> want = {
      "model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors", "model-00003-of-00005.safetensors",
      "model-00004-of-00005.safetensors", "model-00005-of-00005.safetensors", kIndexFile};
  EXPECT_EQ(files, want);
  for (const auto& f : want) EXPECT_TRUE(fs::exists(fs::path(path("ckpt")) / f)) << f;
  const auto index = nlohmann::json::parse(readFile(fs::path(path("ckpt")) / kIndexFile));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 3u * 192 + 400 + 4);
  EXPECT_EQ(index["weight_map"]["layers.3.w"], "model-00002-of-00005.safetensors");
  EXPECT_EQ(index["weight_map"]["big"], "model-00004-of-00005.safetensors");

  SafetensorsCheckpoint ck(path("ckpt"));
  EXPECT_EQ(ck.files().size(), 5u);
  EXPECT_EQ(ck.tensorBytes(), 3u * 192 + 400 + 4);
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) {
    EXPECT_TRUE(at::equal(ck.get(name), t)) << name;
    names.push_back(name);
  }
  EXPECT_TRUE(at::equal(ck.slice("layers.2.w", {1, 3}, {2, 6}), tensors[2].second.narrow(0, 1, 2).narrow(1, 2, 4)));
  EXPECT_EQ(ck.fileOf("tail").metadata().at("k"), "v");
  ck.expectNames(names);

  // Rewritten whole, the shards and the index go: otherwise the stale index would be read.
  EXPECT_EQ(writeCheckpoint(path("ckpt"), tensors), std::vector<std::string>{kSingleFile});
  EXPECT_FALSE(fs::exists(fs::path(path("ckpt")) / kIndexFile));
  EXPECT_FALSE(fs::exists(fs::path(path("ckpt")) / want[0]));
  SafetensorsCheckpoint single(path("ckpt"));
  EXPECT_EQ(single.files().size(), 1u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(at::equal(single.get(name), t)) << name;
  // A single file by its path too.
  EXPECT_EQ(SafetensorsCheckpoint(path("ckpt/model.safetensors")).names().size(), tensors.size());
}

TEST_F(Safetensors, WriterRefusesWhatTheFormatCannotHold) {
  const std::string file = path("m.safetensors");
  const at::Tensor w = at::ones({2});
  expectError([&] { writeSafetensors(file, {{"w", w}, {"w", w}}); }, {file, "tensor 'w' is given twice"});
  expectError([&] { writeCheckpoint(path("d"), {{"w", w}, {"w", w}}); }, {path("d"), "tensor 'w' is given twice"});
  expectError([&] { writeSafetensors(file, {{"__metadata__", w}}); }, {file, "may not be named __metadata__"});
  expectError([&] { writeSafetensors(file, {{"c", at::ones({2}, at::kComplexFloat)}}); },
              {file, "tensor 'c' has dtype ComplexFloat"});
  expectError([&] { writeSafetensors(file, {{"u", at::Tensor()}}); }, {file, "tensor 'u' is undefined"});
  expectError([&] { writeSafetensors(file, {{std::string("bad\xff", 4), w}}); }, {file, "not UTF-8"});
  EXPECT_FALSE(fs::exists(file));
  EXPECT_FALSE(fs::exists(file + ".tmp"));
}

// Non-contiguous and strided inputs are written as their values.
TEST_F(Safetensors, WritesNonContiguousTensors) {
  const at::Tensor w = pattern("w", at::kFloat, {4, 6});
  writeSafetensors(path("m.safetensors"), {{"t", w.t()}, {"n", w.narrow(1, 1, 3)}});
  SafetensorsFile f(path("m.safetensors"));
  EXPECT_TRUE(at::equal(f.get("t"), w.t()));
  EXPECT_TRUE(at::equal(f.get("n"), w.narrow(1, 1, 3)));
}

}  // namespace
