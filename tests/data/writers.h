#pragma once
// Test-only writers of the token formats, byte by byte from the layouts in data/formats.h
// (independent of any tessera writer), with knobs to corrupt them; a fixture with a fresh
// directory per test and an error-text matcher for the data suites.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/common/error.h"

namespace tessera::testing {

using Docs = std::vector<std::vector<int64_t>>;

inline void appendBytes(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
template <typename T>
void appendValue(std::string& out, T v) {
  appendBytes(out, &v, sizeof(T));
}

inline void writeFile(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string readFile(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Megatron .bin/.idx: `seqs` the sequences, `docEnds` the sequence count at the end of each
// document (empty: one sequence per document). code 8 uint16, 4 int32.
inline void writeMegatron(const std::string& prefix, const Docs& seqs, int code = 8,
                          std::vector<int64_t> docEnds = {}) {
  std::string bin, idx;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  for (const auto& s : seqs) {
    pointers.push_back(static_cast<int64_t>(bin.size()));
    lengths.push_back(static_cast<int32_t>(s.size()));
    for (int64_t t : s) {
      if (code == 8) {
        appendValue<uint16_t>(bin, static_cast<uint16_t>(t));
      } else {
        appendValue<int32_t>(bin, static_cast<int32_t>(t));
      }
    }
  }
  if (docEnds.empty()) {
    for (size_t i = 1; i <= seqs.size(); ++i) docEnds.push_back(static_cast<int64_t>(i));
  }
  appendBytes(idx, "MMIDIDX\0\0", 9);
  appendValue<uint64_t>(idx, 1);
  appendValue<uint8_t>(idx, static_cast<uint8_t>(code));
  appendValue<uint64_t>(idx, seqs.size());
  appendValue<uint64_t>(idx, docEnds.size() + 1);
  for (auto l : lengths) appendValue(idx, l);
  for (auto p : pointers) appendValue(idx, p);
  appendValue<int64_t>(idx, 0);
  for (auto d : docEnds) appendValue(idx, d);
  writeFile(prefix + ".bin", bin);
  writeFile(prefix + ".idx", idx);
}

// An llm.c shard: uint16 (magic 20240520, version 1) or uint32 (20240801, version 7).
// Tokens as uint32 (`wide`) or uint16, little-endian.
inline void appendTokens(std::string& out, const std::vector<int64_t>& tokens, bool wide) {
  for (int64_t t : tokens) {
    if (wide) {
      appendValue<uint32_t>(out, static_cast<uint32_t>(t));
    } else {
      appendValue<uint16_t>(out, static_cast<uint16_t>(t));
    }
  }
}

inline void writeLlmc(const std::string& file, const std::vector<int64_t>& tokens, bool wide = false,
                      int32_t countOverride = -1) {
  std::string out;
  int32_t header[256] = {};
  header[0] = wide ? 20240801 : 20240520;
  header[1] = wide ? 7 : 1;
  header[2] = countOverride >= 0 ? countOverride : static_cast<int32_t>(tokens.size());
  appendBytes(out, header, sizeof(header));
  appendTokens(out, tokens, wide);
  writeFile(file, out);
}

inline void writeRaw(const std::string& file, const std::vector<int64_t>& tokens, bool wide) {
  std::string out;
  appendTokens(out, tokens, wide);
  writeFile(file, out);
}

// A fresh directory per test (named after the test), removed afterwards; path(name) inside it.
class DataDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tessera-data-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

// The tessera::Error `f` throws contains every one of `parts` (a failure when none is thrown).
template <typename F>
void expectError(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one with: " << *parts.begin();
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace tessera::testing
