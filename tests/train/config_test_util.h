#pragma once
// Helpers of the training config's tests (test_config.cpp, test_config_file.cpp): parse a command
// line as train_gpt does, its UsageError, and a fixture with a temporary directory for files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/train/config.h"

namespace tessera::train::config_test {

inline Config parse(std::vector<std::string> args, bool onGpu = false, const tessera::Settings& env = {}) {
  return Config::parse(args, Machine{onGpu, env});
}

// The UsageError of these flags; "" when they parse.
inline std::string refusal(std::vector<std::string> args, bool onGpu = false) {
  try {
    parse(std::move(args), onGpu);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

class Options : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera_options_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir;
};

}  // namespace tessera::train::config_test
