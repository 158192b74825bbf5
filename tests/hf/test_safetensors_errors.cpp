// src/hf: every malformed safetensors file (written byte by byte here, hf_testing.h) and every
// inconsistent checkpoint is an error naming the file and the tensor.
#include <gtest/gtest.h>

#include <filesystem>

#include "tessera/hf/safetensors.h"
#include "hf_testing.h"

using namespace tessera;
using namespace tessera::hf;
using namespace tessera::testing;
namespace fs = std::filesystem;

namespace {

using SafetensorsErrors = HfDir;

// A one-tensor header: `entry` is the value of tensor "w".
std::string oneTensor(const std::string& entry) { return R"({"w": )" + entry + "}"; }

TEST_F(SafetensorsErrors, MalformedFilesNameFileAndTensor) {
  const std::string file = path("bad.safetensors");
  auto expectBad = [&](const std::string& bytes, std::initializer_list<std::string> parts) {
    writeFile(file, bytes);
    expectError([&] { SafetensorsFile f(file); }, parts);
  };
  const std::string w = R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  expectError([&] { SafetensorsFile f(file); }, {file, "does not exist"});
  expectError([&] { SafetensorsFile f(path("")); }, {"is not a regular file"});
  // Truncated and length problems.
  expectBad("", {file, "truncated: 0 bytes"});
  expectBad(std::string("\x10\0\0", 3), {file, "truncated: 3 bytes"});
  expectBad(rawSafetensors(oneTensor(w), zeros(8)).substr(0, 20), {file, "runs past the end of the 20-byte file"});
  std::string huge;
  appendValue<uint64_t>(huge, uint64_t{1} << 40);
  expectBad(huge + "{}", {file, "header length 1099511627776 is over the limit"});
  // Not JSON, not an object, a bad entry.
  expectBad(rawSafetensors("{\"w\": ", ""), {file, "the 6-byte header is not valid JSON"});
  expectBad(rawSafetensors("[1, 2]", ""), {file, "the header is JSON array, not an object"});
  expectBad(rawSafetensors(oneTensor("[0, 8]"), zeros(8)), {file, "tensor 'w'", "not an object with dtype"});
  expectBad(rawSafetensors(oneTensor(R"({"shape": [2], "data_offsets": [0, 8]})"), zeros(8)),
            {file, "tensor 'w'", "no 'dtype'"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F32", "data_offsets": [0, 8]})"), zeros(8)),
            {file, "tensor 'w'", "no 'shape'"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F32", "shape": [2]})"), zeros(8)),
            {file, "tensor 'w'", "no 'data_offsets'"});
  // dtype, shape, offsets.
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]})"), zeros(8)),
            {file, "tensor 'w'", "unknown dtype \"F8_E4M3\"", "tessera reads F64, F32"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": 4, "shape": [2], "data_offsets": [0, 8]})"), zeros(8)),
            {file, "tensor 'w'", "unknown dtype 4"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]})"), zeros(8)),
            {file, "tensor 'w'", "dimension 1 of shape [2,-1] is not an integer"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]})"), zeros(8)),
            {file, "tensor 'w'", "dimension 0"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F32", "shape": 2, "data_offsets": [0, 8]})"), zeros(8)),
            {file, "tensor 'w'", "shape 2 is not an array"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]})"),
                           zeros(8)),
            {file, "tensor 'w'", "more elements than int64"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 16]})"), zeros(8)),
            {file, "tensor 'w'", "data_offsets [0, 16] lie past the data section's 8 bytes"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F32", "shape": [0], "data_offsets": [8, 0]})"), zeros(8)),
            {file, "tensor 'w'", "[8, 0] begin after they end"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F32", "shape": [2], "data_offsets": [0]})"), zeros(8)),
            {file, "tensor 'w'", "not two integers"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]})"), zeros(8)),
            {file, "tensor 'w'", "shape [3] of F32 needs 12 bytes, data_offsets [0, 8] hold 8"});
  expectBad(rawSafetensors(oneTensor(R"({"dtype": "BF16", "shape": [2], "data_offsets": [0, 8]})"), zeros(8)),
            {file, "tensor 'w'", "shape [2] of BF16 needs 4 bytes"});
  // Coverage of the data section.
  const std::string a = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  expectBad(rawSafetensors("{" + a + R"(, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", zeros(8)),
            {file, "tensor 'b' (data_offsets [4, 8]) overlaps tensor 'a' ([0, 8])"});
  expectBad(rawSafetensors("{" + a + R"(, "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})", zeros(16)),
            {file, "bytes [8, 12) of the data section belong to no tensor (a gap before tensor 'b')"});
  expectBad(rawSafetensors("{" + a + "}", zeros(12)), {file, "4 trailing bytes belong to no tensor"});
  expectBad(rawSafetensors("{" + a + ", " + a + "}", zeros(8)), {file, "tensor 'a' appears twice"});
  expectBad(rawSafetensors(R"({"a": {"dtype": "F32", "dtype": "F16", "shape": [2], "data_offsets": [0, 8]}})",
                           zeros(8)),
            {file, "key 'dtype' appears twice"});
  // __metadata__.
  expectBad(rawSafetensors("{" + a + R"(, "__metadata__": ["x"]})", zeros(8)),
            {file, "__metadata__ is [\"x\"], not an object of strings"});
  expectBad(rawSafetensors("{" + a + R"(, "__metadata__": {"step": 7}})", zeros(8)),
            {file, "__metadata__ 'step' is 7, not a string"});
  // A valid file cut short: the data section no longer holds the last tensor.
  writeSafetensors(file, {{"x", at::ones({4})}, {"y", at::ones({2}, at::kHalf)}});
  auto bytes = readFile(file);
  expectBad(bytes.substr(0, bytes.size() - 2), {file, "tensor 'y'", "lie past the data section"});
}

TEST_F(SafetensorsErrors, AcceptedEdgeCases) {
  // No padding, null metadata, an unknown key in an entry, a scalar, an empty tensor, no tensors.
  writeFile(path("m.safetensors"),
            rawSafetensors(R"({"__metadata__": null, "s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4], )"
                           R"("extra": 1}, "e": {"dtype": "I64", "shape": [3, 0], "data_offsets": [4, 4]}})",
                           std::string("\0\0\x80\x3f", 4)));
  SafetensorsFile f(path("m.safetensors"));
  EXPECT_EQ(f.get("s").item<float>(), 1.0f);
  EXPECT_EQ(f.get("e").sizes(), (at::IntArrayRef{3, 0}));
  EXPECT_TRUE(f.metadata().empty());
  writeFile(path("none.safetensors"), rawSafetensors("{}", ""));
  EXPECT_TRUE(SafetensorsFile(path("none.safetensors")).names().empty());
}

TEST_F(SafetensorsErrors, BoolBytesMustBeZeroOrOne) {
  writeFile(path("b.safetensors"),
            rawSafetensors(R"({"m": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}})", std::string("\1\0\2", 3)));
  SafetensorsFile f(path("b.safetensors"));
  expectError([&] { f.get("m"); }, {path("b.safetensors"), "tensor 'm' (BOOL) holds byte 2 at element 2"});
  EXPECT_TRUE(at::equal(f.slice("m", {0, 2}), at::tensor({1, 0}).to(at::kBool)));
}

// A sharded checkpoint with one thing wrong at a time.
TEST_F(SafetensorsErrors, InconsistentCheckpointsNameFileAndTensor) {
  const NamedTensors tensors = {{"a", at::ones({4})}, {"b", at::ones({4})}, {"c", at::ones({4})}};
  WriteOptions o;
  o.maxShardBytes = 16;
  const fs::path dir = path("ckpt");
  const std::string index = (dir / kIndexFile).string();
  const std::string shard1 = (dir / "model-00001-of-00003.safetensors").string();
  const std::string shard2 = (dir / "model-00002-of-00003.safetensors").string();
  auto expectBad = [&](const std::function<void()>& damage, std::initializer_list<std::string> parts) {
    fs::remove_all(dir);
    writeCheckpoint(dir.string(), tensors, {}, o);
    damage();
    expectError([&] { SafetensorsCheckpoint ck(dir.string()); }, parts);
  };
  auto editIndex = [&](const std::string& from, const std::string& to) {
    auto text = readFile(index);
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << text;
    writeFile(index, text.replace(at, from.size(), to));
  };
  expectBad([&] { fs::remove(shard2); }, {index, "maps tensor 'b' to", shard2, "which does not exist"});
  // The index lists a tensor its shard lacks (missing), a shard holds one the index lacks (unexpected).
  expectBad([&] { editIndex("\"b\"", "\"zz\""); }, {index, "maps tensor 'zz' to", shard2, "has no such tensor"});
  expectBad([&] { writeSafetensors(shard2, {{"b", at::ones({4})}, {"x", at::ones({1})}}); },
            {shard2, "holds tensor 'x', which", index, "does not list"});
  expectBad([&] { writeSafetensors(shard1, {{"a", at::ones({4})}, {"b", at::ones({4})}}); },
            {shard1, "holds tensor 'b', which", "maps to 'model-00002-of-00003.safetensors'"});
  expectBad([&] { editIndex("\"model-00001-of-00003.safetensors\"", "\"../x.safetensors\""); },
            {index, "tensor 'a' is mapped to '../x.safetensors', not a file inside the directory"});
  expectBad([&] { editIndex("\"weight_map\"", "\"weights\""); }, {index, "no \"weight_map\""});
  expectBad([&] { writeFile(index, "{\"weight_map\": {"); }, {index, "is not valid JSON"});
  expectBad([&] { writeFile(shard2, "\x08"); }, {shard2, "truncated: 1 bytes"});
  expectBad([&] { fs::remove(index); }, {dir.string(), "has neither", kIndexFile, kSingleFile});
  expectError([&] { SafetensorsCheckpoint ck(path("nowhere")); }, {path("nowhere"), "does not exist"});

  fs::remove_all(dir);
  writeCheckpoint(dir.string(), tensors, {}, o);
  SafetensorsCheckpoint ck(dir.string());
  expectError([&] { ck.get("d"); }, {dir.string(), "has no tensor 'd'"});
  expectError([&] { ck.expectNames({"a", "b", "d", "e"}); },
              {dir.string(), "2 missing: 'd', 'e'", "1 unexpected: 'c' (in", "model-00003-of-00003.safetensors"});
  ck.expectNames({"c", "b", "a"});
}

}  // namespace
