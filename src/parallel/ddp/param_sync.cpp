#include "parallel/ddp/param_sync.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

#include "common/error.h"

namespace tessera::ddp {
namespace {

constexpr int64_t kDescLen = 256;

std::string describe(const std::pair<std::string, at::Tensor>& p) {
  return fmt::format("'{}' [{}] {}", p.first, fmt::join(p.second.sizes(), ", "), dtypeName(p.second.scalar_type()));
}

int64_t hashOf(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);  // non-negative, never the padding value -1
}

at::Tensor allGather(Communicator& comm, const at::Tensor& mine) {
  auto all = at::empty({comm.size() * mine.numel()}, mine.options());
  comm.allGather(all, mine)->synchronize();
  return all.cpu().view({comm.size(), mine.numel()});
}

}  // namespace

void checkSameParameters(Communicator& comm, const std::vector<std::pair<std::string, at::Tensor>>& params,
                         const at::TensorOptions& scratch) {
  auto longs = scratch.dtype(at::kLong);
  int64_t n = static_cast<int64_t>(params.size());
  auto counts = allGather(comm, at::full({1}, n, longs));
  int64_t maxN = counts.max().item<int64_t>();
  std::vector<int64_t> mine(maxN, -1);
  for (int64_t i = 0; i < n; ++i) mine[i] = hashOf(describe(params[i]));
  auto hashes = allGather(comm, at::tensor(mine, at::kLong).to(longs.device()));
  int64_t bad = -1;
  for (int64_t i = 0; i < maxN && bad < 0; ++i) {
    if (!hashes.select(1, i).eq(hashes[0][i]).all().item<bool>()) bad = i;
  }
  if (bad < 0) return;
  // Every rank knows `bad`: exchange what each has there and fail with the same message.
  std::string d = bad < n ? describe(params[bad]) : "(none)";
  d.resize(kDescLen, '\0');
  std::vector<int32_t> chars(d.begin(), d.end());
  auto descs = allGather(comm, at::tensor(chars, at::kInt).to(longs.device()));
  std::string msg = fmt::format(
      "DistributedDataParallel: the ranks' parameters differ (count per rank: {}); first difference at parameter "
      "#{}:",
      fmt::join(std::vector<int64_t>(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + comm.size()), ", "),
      bad);
  for (int r = 0; r < comm.size(); ++r) {
    std::string s;
    for (int64_t k = 0; k < kDescLen; ++k) {
      char c = static_cast<char>(descs[r][k].item<int32_t>());
      if (!c) break;
      s += c;
    }
    msg += fmt::format(" rank {} has {};", r, s);
  }
  msg.pop_back();
  throw Error(msg);
}

void broadcastTensors(Communicator& comm, const std::vector<at::Tensor>& tensors, int root) {
  std::map<c10::ScalarType, std::vector<at::Tensor>> byType;
  for (const auto& t : tensors) {
    if (t.numel() > 0) byType[t.scalar_type()].push_back(t);
  }
  for (auto& [type, ts] : byType) {
    std::vector<at::Tensor> flat;
    for (auto& t : ts) flat.push_back(t.detach().reshape({-1}));
    auto buf = at::cat(flat);
    comm.broadcast(buf, root)->synchronize();
    int64_t off = 0;
    for (auto& t : ts) {
      t.detach().copy_(buf.narrow(0, off, t.numel()).view_as(t));
      off += t.numel();
    }
  }
}

}  // namespace tessera::ddp
