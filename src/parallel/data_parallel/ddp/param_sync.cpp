#include "parallel/data_parallel/ddp/param_sync.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "tessera/common/error.h"

namespace tessera::ddp {
namespace {

constexpr int64_t kTextLen = 1024;  // characters per rank in an exchange of text, the last one '\0'
const char* const kKinds[] = {"option", "parameter", "buffer"};

int64_t hashOf(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);  // non-negative, never the padding value -1
}

// Every rank's `mine` (same length on every rank), as rows of a CPU tensor [size, n].
at::Tensor allGather(Communicator& comm, const std::vector<int64_t>& mine, const at::TensorOptions& scratch) {
  const auto n = static_cast<int64_t>(mine.size());
  auto opts = scratch.dtype(at::kLong);
  auto in = at::tensor(mine, at::kLong).to(opts.device());
  auto all = at::empty({comm.size() * n}, opts);
  comm.allGather(all, in)->synchronize();
  return all.cpu().view({comm.size(), n}).contiguous();
}

std::vector<std::string> allGatherText(Communicator& comm, const std::string& mine, const at::TensorOptions& scratch) {
  std::vector<int64_t> chars(kTextLen, 0);
  for (size_t k = 0; k < mine.size() && k + 1 < static_cast<size_t>(kTextLen); ++k) {
    chars[k] = static_cast<unsigned char>(mine[k]);
  }
  auto all = allGather(comm, chars, scratch);
  auto a = all.accessor<int64_t, 2>();
  std::vector<std::string> out(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    for (int64_t k = 0; k < kTextLen && a[r][k]; ++k) out[r] += static_cast<char>(a[r][k]);
  }
  return out;
}

std::string ranksText(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

void agree(Communicator& comm, const RankState& mine, const at::TensorOptions& scratch) {
  const std::vector<std::string>* kinds[] = {&mine.options, &mine.params, &mine.buffers};
  const int size = comm.size();
  std::vector<int64_t> head = {mine.problem.empty() ? 0 : 1};
  for (const auto* k : kinds) head.push_back(static_cast<int64_t>(k->size()));
  auto heads = allGather(comm, head, scratch);
  auto h = heads.accessor<int64_t, 2>();

  bool anyProblem = false;
  for (int r = 0; r < size; ++r) anyProblem = anyProblem || h[r][0] != 0;
  if (anyProblem) {
    auto problems = allGatherText(comm, mine.problem, scratch);
    std::vector<std::pair<std::string, std::vector<int>>> groups;  // problem → ranks, by first rank
    for (int r = 0; r < size; ++r) {
      if (!h[r][0]) continue;
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == problems[r]; });
      if (it == groups.end()) it = groups.insert(groups.end(), {problems[r], {}});
      it->second.push_back(r);
    }
    std::string msg = "DistributedDataParallel:";
    for (const auto& [problem, ranks] : groups) msg += fmt::format(" on {}: {};", ranksText(ranks), problem);
    msg.pop_back();
    throw Error(msg);
  }

  // One hash per entry, each kind padded to its longest rank's count (-1: no entry).
  std::vector<int64_t> hashes = {0};  // never empty
  std::vector<int64_t> longest(3, 0);
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < size; ++r) longest[k] = std::max(longest[k], h[r][k + 1]);
    for (int64_t i = 0; i < longest[k]; ++i) {
      hashes.push_back(i < static_cast<int64_t>(kinds[k]->size()) ? hashOf((*kinds[k])[i]) : -1);
    }
  }
  auto all = allGather(comm, hashes, scratch);
  auto a = all.accessor<int64_t, 2>();
  int badKind = -1;
  int64_t bad = -1, col = 1;
  for (int k = 0; k < 3 && badKind < 0; ++k) {
    for (int64_t i = 0; i < longest[k] && badKind < 0; ++i, ++col) {
      for (int r = 1; r < size; ++r) {
        if (a[r][col] != a[0][col]) {
          badKind = k;
          bad = i;
          break;
        }
      }
    }
  }
  if (badKind < 0) return;
  // Every rank knows where: exchange what each has there and fail with the same message.
  const auto& list = *kinds[badKind];
  auto there = allGatherText(comm, bad < static_cast<int64_t>(list.size()) ? list[bad] : "(none)", scratch);
  std::vector<int64_t> counts;
  for (int r = 0; r < size; ++r) counts.push_back(h[r][badKind + 1]);
  std::string msg = fmt::format("DistributedDataParallel: the ranks' {}s differ (count per rank: {}); first difference "
                                "at {} #{}:",
                                kKinds[badKind], fmt::join(counts, ", "), kKinds[badKind], bad);
  for (int r = 0; r < size; ++r) msg += fmt::format(" rank {} has {};", r, there[r]);
  msg.pop_back();
  throw Error(msg);
}

std::string describeTensor(const std::string& name, const at::Tensor& t, bool withGrad) {
  return fmt::format("'{}' [{}] {}{}{}", name, fmt::join(t.sizes(), ", "), dtypeName(t.scalar_type()),
                     t.device().is_cpu() ? "" : fmt::format(" ({})", c10::DeviceTypeName(t.device().type(), true)),
                     withGrad && !t.requires_grad() ? " requires_grad=false" : "");
}

void checkSameParameters(Communicator& comm, const std::vector<std::pair<std::string, at::Tensor>>& params,
                         const at::TensorOptions& scratch) {
  RankState mine;
  for (const auto& [name, t] : params) mine.params.push_back(describeTensor(name, t, true));
  agree(comm, mine, scratch);
}

void broadcastTensors(Communicator& comm, const std::vector<at::Tensor>& tensors, int root, size_t bucketBytes) {
  std::map<c10::ScalarType, std::vector<at::Tensor>> byType;
  for (const auto& t : tensors) {
    if (t.numel() > 0) byType[t.scalar_type()].push_back(t.detach());
  }
  auto bytes = [](const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); };
  for (auto& [type, ts] : byType) {
    for (size_t i = 0; i < ts.size();) {
      if (bytes(ts[i]) >= bucketBytes) {  // alone: no staging copy when it is contiguous
        auto& t = ts[i++];
        auto buf = t.is_contiguous() ? t : t.contiguous();
        comm.broadcast(buf, root)->synchronize();
        if (!buf.is_same(t)) t.copy_(buf);
        continue;
      }
      std::vector<at::Tensor> group, flat;
      size_t total = 0;
      while (i < ts.size() && bytes(ts[i]) < bucketBytes && (group.empty() || total + bytes(ts[i]) <= bucketBytes)) {
        total += bytes(ts[i]);
        group.push_back(ts[i]);
        flat.push_back(ts[i].reshape({-1}));
        ++i;
      }
      auto buf = at::cat(flat);
      comm.broadcast(buf, root)->synchronize();
      int64_t off = 0;
      for (auto& t : group) {
        t.copy_(buf.narrow(0, off, t.numel()).view_as(t));
        off += t.numel();
      }
    }
  }
}

}  // namespace tessera::ddp
