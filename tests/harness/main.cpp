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
  const int rc = RUN_ALL_TESTS();
  // Every test that ran was skipped (e.g. a GPU suite without GPUs) and none failed: exit 77,
  // which ctest reports as skipped (SKIP_RETURN_CODE). A failure next to skips stays a failure.
  const auto* u = ::testing::UnitTest::GetInstance();
  if (rc == 0 && u->skipped_test_count() > 0 && u->successful_test_count() == 0 && u->failed_test_count() == 0)
    return 77;
  return rc;
}
