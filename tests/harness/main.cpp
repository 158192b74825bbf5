// Test main: runs as a multi-process worker when TESSERA_TEST_WORKER is set (see
// multiprocess.h), otherwise as an ordinary GoogleTest binary.
#include <gtest/gtest.h>

#include <cstdlib>

namespace tessera::testing {
int runWorkerFromEnv(const char* name);
}

int main(int argc, char** argv) {
  if (const char* w = std::getenv("TESSERA_TEST_WORKER")) return tessera::testing::runWorkerFromEnv(w);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
