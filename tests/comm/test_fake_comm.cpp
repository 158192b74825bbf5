// The fake communicator's timing (src/comm/fake/fake_timing.h) and the Keep contract (types.h).
// CPU: the model's formulas, FakeTiming's checks and their errors, timing refused off CUDA.
// GPU (test_fake_comm_gpu, one GPU): a timed op runs on its own stream after the caller's work —
// its output is written only after the modelled time and Work::wait() orders the caller's
// stream after it; tensors stay referenced until the op is seen complete (Keep::UntilDone),
// are never referenced for Keep::ByCaller, and are again with ignoreByCaller.
// The modelled times here are long (0.3 s) so that "not done yet" holds on any machine.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "comm/fake/fake_communicator.h"
#include "comm/fake/fake_timing.h"
#include "tessera/common/error.h"
#ifdef TESSERA_FAKE_COMM_GPU_SUITE
#include "comm/gpu/gpu_test_util.h"
#endif

using namespace tessera;

namespace {

TEST(FakeTiming, ModelUsesBusBandwidthDefinitions) {
  FakeTiming t;
  t.latencyUs = 10;
  t.allReduceGBps = 100;
  t.allGatherGBps = 50;
  t.reduceScatterGBps = 25;
  t.otherGBps = 200;
  const double mb = 1e6;
  // 2 ranks: all-reduce moves 2·(1/2)·bytes, all-gather / reduce-scatter (1/2)·bytes.
  EXPECT_NEAR(fakeOpSeconds(t, "all_reduce", 100 * mb, 2), 10e-6 + 100 * mb / 100e9, 1e-12);
  EXPECT_NEAR(fakeOpSeconds(t, "all_gather", 100 * mb, 2), 10e-6 + 50 * mb / 50e9, 1e-12);
  EXPECT_NEAR(fakeOpSeconds(t, "reduce_scatter", 100 * mb, 4), 10e-6 + 75 * mb / 25e9, 1e-12);
  EXPECT_NEAR(fakeOpSeconds(t, "batch_p2p", 100 * mb, 2), 10e-6 + 100 * mb / 200e9, 1e-12);
  EXPECT_NEAR(fakeOpSeconds(t, "barrier", 0, 8), 10e-6, 1e-12);
}

TEST(FakeTiming, Validate) {
  FakeTiming t;
  validate(t);  // untimed: nothing to check
  t.enabled = true;
  validate(t);  // the defaults
  t.ctas = 8;
  t.traffic = true;
  validate(t);
  EXPECT_NE(t.describe().find("memory traffic"), std::string::npos) << t.describe();
  auto refused = [](FakeTiming bad, const std::string& field) {
    try {
      validate(bad);
      ADD_FAILURE() << "a bad " << field << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  FakeTiming bad = t;
  bad.allGatherGBps = 0;
  refused(bad, "allGatherGBps = 0");
  bad = t;
  bad.latencyUs = -1;
  refused(bad, "latencyUs = -1");
  bad = t;
  bad.ctas = 0;  // traffic without SMs to stream with
  refused(bad, "traffic needs ctas > 0");
  bad.enabled = false;
  validate(bad);  // untimed: the fields are not used
}

TEST(FakeTiming, RefusedOnTheCpu) {
  FakeTiming t;
  t.enabled = true;
  try {
    makeFakeCommunicator(0, 2, at::kCPU, "cpu", t);
    FAIL() << "a timed fake communicator was made on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a CUDA device"), std::string::npos) << e.what();
  }
}

#ifdef TESSERA_FAKE_COMM_GPU_SUITE

const at::Device kDev(at::kCUDA, 0);

FakeTiming slow(bool ignoreByCaller = false, bool traffic = false) {
  FakeTiming t;
  t.enabled = true;
  t.latencyUs = 300000;  // 0.3 s per op
  t.ignoreByCaller = ignoreByCaller;
  t.ctas = traffic ? 4 : 0;
  t.traffic = traffic;
  return t;
}

// Both kernels: the sleeping one, and with `traffic` the one copying memory for the op's time.
class FakeTimingGpuKernels : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(SpinOrTraffic, FakeTimingGpuKernels, ::testing::Bool());

TEST_P(FakeTimingGpuKernels, OutputWrittenAfterTheModelledTimeAndWaitOrdersTheCaller) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  auto c = makeFakeCommunicator(1, 2, kDev, "timed", slow(false, GetParam()));
  auto in = at::arange(6, at::TensorOptions().dtype(at::kFloat).device(kDev));
  auto out = at::zeros({12}, in.options());
  auto w = c->allGather(out, in);
  EXPECT_FALSE(w->completed()) << "an op modelled at 0.3 s was done at once";
  // Not waited: the caller's stream may read the output before the op wrote it.
  EXPECT_EQ(out.cpu().abs().sum().item<double>(), 0.0);
  w->wait();  // the caller's stream now runs after the op
  auto expect = at::cat({in, in}).cpu();
  EXPECT_TRUE(at::equal(out.cpu(), expect));
  EXPECT_TRUE(w->completed());

  // Reduce-scatter keeps this rank's slot (rank 1 of 2).
  auto rsIn = at::arange(8, in.options()), rsOut = at::zeros({4}, in.options());
  c->reduceScatter(rsOut, rsIn)->wait();
  EXPECT_TRUE(at::equal(rsOut.cpu(), rsIn.narrow(0, 4, 4).cpu()));
}

TEST(FakeTimingGpu, KeepContract) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  for (bool ignore : {false, true}) {
    auto c = makeFakeCommunicator(0, 2, kDev, "timed", slow(ignore));
    auto out = at::zeros({4}, at::TensorOptions().device(kDev)), in = at::ones({8}, out.options());
    auto kept = c->reduceScatter(out, in);  // UntilDone: referenced by the op until it is done
    EXPECT_GT(in.use_count(), 1) << "ignore " << ignore;
    kept->synchronize();
    EXPECT_EQ(in.use_count(), 1) << "still referenced after the op completed (ignore " << ignore << ")";

    auto mine = c->reduceScatter(out, in, ReduceOp::Sum, Keep::ByCaller);
    EXPECT_FALSE(mine->completed());
    if (ignore) {
      EXPECT_GT(in.use_count(), 1) << "ignoreByCaller must keep ByCaller tensors too";
    } else {
      EXPECT_EQ(in.use_count(), 1) << "a ByCaller op referenced its input";
      EXPECT_EQ(out.use_count(), 1) << "a ByCaller op referenced its output";
    }
    mine->synchronize();
    EXPECT_TRUE(at::equal(out.cpu(), at::ones({4})));
  }
}

#endif

}  // namespace
