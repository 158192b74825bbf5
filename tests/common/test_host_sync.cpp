// common/host_sync.h on the CPU (its CUDA side runs in train.gpu_no_host_sync): a read-back
// holds the values of the moment it was queued, get() without a queue and marks never made are
// errors naming the class, and a sync check is a no-op on the CPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tessera/common/error.h"
#include "tessera/common/host_sync.h"

using namespace tessera;

TEST(Readback, HoldsTheValuesWhenQueued) {
  Readback r;
  EXPECT_FALSE(r.queued());
  auto t = at::arange(5, at::kFloat);
  r.queue(t);
  t.fill_(-1);  // the source may change after queue()
  ASSERT_TRUE(r.queued());
  EXPECT_TRUE(at::equal(r.get(), at::arange(5, at::kFloat)));
  try {
    Readback().get();
    FAIL() << "get() with nothing queued returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Readback"), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.queue(at::Tensor()), Error);
}

TEST(StreamMarks, TimeBetweenMarksOnTheHost) {
  StreamMarks m;
  EXPECT_EQ(m.mark(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(m.mark(), 1);
  EXPECT_GE(m.ms(0, 1), 19.0);
  EXPECT_LE(m.ms(1, 1), 0.0);
  try {
    m.ms(0, 2);
    FAIL() << "a mark never made was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 made"), std::string::npos) << e.what();
  }
}

TEST(SyncCheck, NothingToCheckOnTheCpu) {
  SyncCheck check(at::kCPU, SyncDebug::Error);
  auto x = at::ones({3});
  EXPECT_EQ(x.sum().item<float>(), 3.0f);  // no device: nothing is a host synchronization
  EXPECT_STREQ(toString(SyncDebug::Warn), "warn");
}
