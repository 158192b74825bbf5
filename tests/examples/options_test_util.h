#pragma once
// Helpers of train_gpt's option tests (test_options.cpp, test_options_config.cpp): parse a command
// line as train_gpt would, its UsageError, and a fixture with a temporary directory for files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpt/options.h"

namespace tessera::gpt::options_test {

inline TrainOptions parse(std::vector<std::string> args, bool onGpu = false, const tessera::Settings& env = {}) {
  std::vector<char*> argv{const_cast<char*>("train_gpt")};
  for (auto& a : args) argv.push_back(a.data());
  return parseOptions(static_cast<int>(argv.size()), argv.data(), onGpu, env);
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

}  // namespace tessera::gpt::options_test
