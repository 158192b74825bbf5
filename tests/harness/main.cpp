// Test main: runs as a multi-process worker when TESSERA_TEST_WORKER is set (see
// multiprocess.h), otherwise as an ordinary GoogleTest binary whose workers are forks of a
// zygote started here, before anything else (spawn.h).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "harness/spawn.h"

namespace tessera::testing {
int runWorkerFromEnv(const char* name);
}

int main(int argc, char** argv) {
  // A worker ends without static destructors: LibTorch's unregister every operator, which was
  // most of a short worker's CPU time. Its output is flushed; the worker function's own objects
  // are destroyed when it returns.
  if (const char* w = std::getenv("TESSERA_TEST_WORKER")) {
    const int rc = tessera::testing::runWorkerFromEnv(w);
    std::fflush(nullptr);
    _exit(rc);
  }
  tessera::testing::startWorkerZygote();
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  // Every test that ran was skipped (e.g. a GPU suite without GPUs) and none failed: exit 77,
  // which ctest reports as skipped (SKIP_RETURN_CODE). A failure next to skips stays a failure.
  const auto* u = ::testing::UnitTest::GetInstance();
  if (rc == 0 && u->skipped_test_count() > 0 && u->successful_test_count() == 0 && u->failed_test_count() == 0)
    return 77;
  return rc;
}
