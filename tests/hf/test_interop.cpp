// src/hf against an independent implementation: tests/hf/interop.py (json, struct and numpy; the
// safetensors package is not on our machines) writes a file tessera reads, and checks the layout
// and values of a sharded checkpoint tessera writes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <iostream>
#include <tuple>

#include "tessera/hf/safetensors.h"
#include "hf_testing.h"

using namespace tessera;
using namespace tessera::hf;
using namespace tessera::testing;

namespace {

using Interop = HfDir;

// Runs interop.py with Debian's python3 (it has numpy; scripts/setup installs it), its output into
// the log; the script's exit status.
int runInterop(const std::string& args, const std::string& log) {
  const auto cmd = fmt::format("/usr/bin/python3 {}/tests/hf/interop.py {} >{} 2>&1", TESSERA_SOURCE_DIR, args, log);
  const int rc = std::system(cmd.c_str());
  std::cout << readFile(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST_F(Interop, ReadsAFileWrittenByPython) {
  ASSERT_EQ(runInterop("write " + path("py.safetensors"), path("write.log")), 0);
  SafetensorsFile f(path("py.safetensors"));
  EXPECT_EQ(f.metadata().at("writer"), "interop.py");
  const std::vector<std::tuple<std::string, at::ScalarType, std::vector<int64_t>>> want = {
      {"h.F16", at::kHalf, {3}},   {"w.F32", at::kFloat, {2, 3}}, {"b.BF16", at::kBFloat16, {2, 2}},
      {"x.F64", at::kDouble, {3}}, {"i.I64", at::kLong, {2}},     {"j.I32", at::kInt, {3}},
      {"k.I16", at::kShort, {1}},  {"c.I8", at::kChar, {5}},      {"u.U8", at::kByte, {4}},
      {"m.BOOL", at::kBool, {3}},  {"s.F32", at::kFloat, {}},     {"e.F32", at::kFloat, {0, 4}}};
  ASSERT_EQ(f.names().size(), want.size());
  int copies = 0;
  for (const auto& [name, type, shape] : want) {
    const at::Tensor t = f.get(name);
    EXPECT_EQ(t.scalar_type(), type) << name;
    EXPECT_TRUE(at::equal(t, pattern(name, type, shape))) << name << ": " << t;
    if (t.numel() > 0 && f.get(name).data_ptr() != t.data_ptr()) ++copies;  // misaligned: copied
  }
  EXPECT_GT(copies, 0);  // the unpadded header and the F16 first leave some tensors misaligned
  const at::Tensor w = pattern("w.F32", at::kFloat, {2, 3});
  EXPECT_TRUE(at::equal(f.slice("w.F32", {1, 2}, {1, 3}), w.narrow(0, 1, 1).narrow(1, 1, 2)));
}

TEST_F(Interop, PythonReadsWhatTesseraWrites) {
  NamedTensors tensors;
  const std::vector<std::pair<at::ScalarType, std::vector<int64_t>>> kinds = {
      {at::kFloat, {4, 6}}, {at::kBFloat16, {8, 3}}, {at::kHalf, {5}}, {at::kBFloat16, {}}, {at::kFloat, {0, 2}}};
  for (int i = 0; i < 10; ++i) {
    const auto& [type, shape] = kinds[i % kinds.size()];
    const std::string name = "model.layers." + std::to_string(i) + ".weight";
    tensors.emplace_back(name, pattern(name, type, shape));
  }
  WriteOptions o;
  o.maxShardBytes = 100;
  EXPECT_GT(writeCheckpoint(path("sharded"), tensors, {}, o).size(), 3u);
  EXPECT_EQ(runInterop("check " + path("sharded"), path("check.log")), 0);
  writeCheckpoint(path("single"), tensors);
  EXPECT_EQ(runInterop("check " + path("single"), path("check1.log")), 0);
}

}  // namespace
