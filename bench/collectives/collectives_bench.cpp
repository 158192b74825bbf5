// tessera's side of the collectives benchmark: busbw of all-reduce, all-gather and
// reduce-scatter over bf16 at 1, 16, 64, 256 and 1024 MiB, measured exactly as
// torch_nccl_bw.py measures PyTorch's (5 warm-ups, 20 timed iterations between two CUDA
// events on the caller's stream, each op followed by Work::wait() as a synchronous
// torch.distributed call does; busbw factors as nccl-tests). Launch under torchrun:
//   torchrun --nproc_per_node=2 --no-python build/bench/tessera_bench_collectives
// Rank 0 prints "BW op size_MiB time_us algbw_GBs busbw_GBs" lines (the same as the Python side).
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "tessera/comm/backends.h"
#include "tessera/comm/bootstrap/init.h"
#include "comm/nccl/cuda_stream.h"
#include "tessera/common/error.h"

namespace {

void cudaOk(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw tessera::Error(fmt::format("bench: {}: {}", what, cudaGetErrorString(e)));
}

// The libnccl files this process has mapped (there should be exactly one).
std::string mappedNccl() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> libs;
  for (std::string line; std::getline(maps, line);) {
    auto p = line.find('/');
    if (p != std::string::npos && line.find("libnccl", p) != std::string::npos) libs.insert(line.substr(p));
  }
  std::string s;
  for (const auto& l : libs) s += (s.empty() ? "" : ", ") + l;
  return s;
}

}  // namespace

int main() {
  auto ctx = tessera::init();
  auto& c = *ctx.world;
  TESSERA_CHECK(c.backend() == tessera::Backend::Nccl, "bench: the world communicator is {}, not nccl",
                tessera::toString(c.backend()));
  const int n = c.size(), r = c.rank(), dev = ctx.device.index();
  auto stream = static_cast<cudaStream_t>(tessera::cuda::currentStream(dev));
  auto opts = at::TensorOptions().device(ctx.device).dtype(at::kBFloat16);
  struct Row {
    std::string op;
    int mb;
    double t, algbw, busbw;
  };
  std::vector<Row> rows;
  for (int mb : {1, 16, 64, 256, 1024}) {
    int64_t numel = static_cast<int64_t>(mb) * (1 << 20) / 2;
    auto x = at::randn({numel}, opts);
    auto outAg = at::empty({numel * n}, opts);
    auto outRs = at::empty({numel / n}, opts);
    struct Op {
      const char* name;
      std::function<void()> fn;
      double factor, bytes;
    };
    std::vector<Op> ops = {
        {"allreduce", [&] { c.allReduce(x)->wait(); }, 2.0 * (n - 1) / n, numel * 2.0},
        {"allgather", [&] { c.allGather(outAg, x)->wait(); }, double(n - 1) / n, numel * 2.0 * n},
        {"reducescatter", [&] { c.reduceScatter(outRs, x)->wait(); }, double(n - 1) / n, numel * 2.0},
    };
    for (auto& op : ops) {
      for (int k = 0; k < 5; ++k) op.fn();
      cudaOk(cudaDeviceSynchronize(), "synchronize");
      cudaEvent_t s, e;
      cudaOk(cudaEventCreate(&s), "event");
      cudaOk(cudaEventCreate(&e), "event");
      const int it = 20;
      cudaOk(cudaEventRecord(s, stream), "record");
      for (int k = 0; k < it; ++k) op.fn();
      cudaOk(cudaEventRecord(e, stream), "record");
      cudaOk(cudaDeviceSynchronize(), "synchronize");
      float ms = 0;
      cudaOk(cudaEventElapsedTime(&ms, s, e), "elapsed");
      cudaEventDestroy(s);
      cudaEventDestroy(e);
      double t = ms / it / 1e3;
      rows.push_back({op.name, mb, t * 1e6, op.bytes / t / 1e9, op.bytes / t / 1e9 * op.factor});
    }
  }
  if (r == 0) {
    fmt::print("INFO tessera nccl {} world {} device {}\n", tessera::ncclVersion(), n, ctx.deviceDescription);
    fmt::print("INFO libnccl {}\n", mappedNccl());
    fmt::print("BW op size_MiB time_us algbw_GBs busbw_GBs\n");
    for (const auto& row : rows)
      fmt::print("BW {} {} {:.1f} {:.1f} {:.1f}\n", row.op, row.mb, row.t, row.algbw, row.busbw);
  }
  c.barrier()->synchronize();
  return 0;
}
