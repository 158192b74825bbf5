// exportLlamaLive (convert.h): a running model's tensors gathered to rank 0 one at a time.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>

#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "hf/convert.h"
#include "hf/families.h"
#include "hf/llama.h"
#include "tessera/hf/safetensors.h"

namespace tessera::hf {

namespace {

constexpr int kMaxPieces = 2;             // pieces of one tensor on one rank
constexpr int64_t kSlot = 1 + 4 * kMaxPieces;  // [count, (row, col, rows, cols) x kMaxPieces]

struct Box {
  int64_t row, col, rows, cols;
  bool operator<(const Box& o) const {
    return std::array<int64_t, 4>{row, col, rows, cols} < std::array<int64_t, 4>{o.row, o.col, o.rows, o.cols};
  }
};

Box boxOf(const checkpoint::Piece& p) {
  const bool two = p.local.dim() == 2;
  return {p.offset[0], two ? p.offset[1] : 0, p.local.size(0), two ? p.local.size(1) : 1};
}

using Owners = std::map<Box, std::pair<int, int>>;  // box -> (rank, its piece index)

// Collective over `world`: every rank's boxes of tensor `name`; every rank derives the same plan,
// each distinct box sent by the lowest rank holding it. The boxes must cover the tensor.
Owners planBoxes(Communicator& world, const std::string& name, const std::vector<int64_t>& shape,
                 const std::vector<checkpoint::Piece>& pieces, const at::Device& dev) {
  std::vector<int64_t> slot(kSlot, 0);
  slot[0] = static_cast<int64_t>(pieces.size());
  for (size_t k = 0; k < pieces.size(); ++k) {
    TESSERA_CHECK(pieces[k].globalShape == shape, "tessera hf: rank {}: '{}' is [{}] here, the config gives [{}]",
                  world.rank(), name, fmt::join(pieces[k].globalShape, ","), fmt::join(shape, ","));
    const Box b = boxOf(pieces[k]);
    std::copy_n(std::array<int64_t, 4>{b.row, b.col, b.rows, b.cols}.begin(), 4, slot.begin() + 1 + 4 * k);
  }
  const auto longs = at::TensorOptions().dtype(at::kLong);
  const int n = world.size();
  auto all = at::empty({n * kSlot}, longs.device(dev));
  world.allGather(all, at::tensor(slot, longs).to(dev))->wait();
  const auto table = all.cpu();
  const int64_t* v = table.data_ptr<int64_t>();
  Owners owner;
  for (int r = 0; r < n; ++r) {
    for (int64_t k = 0; k < v[r * kSlot]; ++k) {
      const int64_t* b = v + r * kSlot + 1 + 4 * k;
      owner.emplace(Box{b[0], b[1], b[2], b[3]}, std::make_pair(r, static_cast<int>(k)));
    }
  }
  int64_t covered = 0;
  for (const auto& kv : owner) covered += kv.first.rows * kv.first.cols;
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  TESSERA_CHECK(covered == numel, "tessera hf: export of '{}': the ranks' pieces cover {} of its {} elements", name,
                covered, numel);
  return owner;
}

// Collective over `world`: the tensor in float32 on rank 0 (undefined elsewhere), each box sent by
// its owner.
at::Tensor collect(Communicator& world, const std::vector<int64_t>& shape, const std::vector<checkpoint::Piece>& pieces,
                   const Owners& owner, const at::Device& dev) {
  const bool root = world.rank() == 0;
  at::Tensor full;
  if (root) full = at::empty(shape, at::kFloat);
  auto boxIn = [&](const Box& b) {
    auto dst = full.narrow(0, b.row, b.rows);
    return shape.size() == 2 ? dst.narrow(1, b.col, b.cols) : dst;
  };
  for (const auto& [b, who] : owner) {
    const auto& [r, k] = who;
    if (r == world.rank() && root) {
      boxIn(b).copy_(pieces[k].local);
    } else if (r == world.rank()) {
      world.send(pieces[k].local.detach().to(dev, at::kFloat).contiguous(), 0)->wait();
    } else if (root) {
      const std::vector<int64_t> sizes = shape.size() == 2 ? std::vector<int64_t>{b.rows, b.cols}
                                                           : std::vector<int64_t>{b.rows};
      auto buf = at::empty(sizes, at::TensorOptions().dtype(at::kFloat).device(dev));
      world.recv(buf, r)->wait();
      boxIn(b).copy_(buf);
    }
  }
  return full;
}

// Expert `e`'s 2-D pieces [rows, cols] of this rank's 3-D pieces [E, rows, cols].
std::vector<checkpoint::Piece> expertPieces(const std::vector<checkpoint::Piece>& pieces, int64_t e) {
  std::vector<checkpoint::Piece> out;
  for (const auto& p : pieces) {
    TESSERA_CHECK(p.local.dim() == 3 && p.offset.size() == 3, "tessera hf: export of '{}': a piece of [{}] elements "
                  "is not a box of the experts", p.name, fmt::join(p.local.sizes(), ", "));
    if (e < p.offset[0] || e >= p.offset[0] + p.local.size(0)) continue;
    out.push_back({p.name, {p.globalShape[1], p.globalShape[2]}, {p.offset[1], p.offset[2]}, p.local[e - p.offset[0]]});
  }
  return out;
}

}  // namespace

void exportLlamaLive(Communicator& world, const models::ModelConfig& c, const std::optional<ConfigJson>& base,
                     const std::string& source, const PieceSource& mine, const std::string& hfDir,
                     const ConvertOptions& o) {
  const bool root = world.rank() == 0;
  const DType d = o.dtype == "fp32" ? DType::F32 : DType::BF16;
  TESSERA_CHECK(o.dtype == "fp32" || o.dtype == "bf16", "tessera hf: export dtype '{}': bf16 or fp32", o.dtype);
  const auto names = tensorMap(c);
  const auto total = static_cast<size_t>(
      std::count_if(names.begin(), names.end(), [](const TensorMap& t) { return !t.hf.empty(); }));
  std::unique_ptr<CheckpointWriter> w;
  if (root) {
    WriteOptions wo;
    wo.maxShardBytes = o.maxShardBytes;
    w = std::make_unique<CheckpointWriter>(hfDir, exportSpecs(c, d), Metadata{}, wo);
  }
  const auto dev = world.scratchOptions().device();
  size_t done = 0;
  uint64_t bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto gatherWrite = [&](const std::string& hf, const std::string& name, const std::vector<int64_t>& shape,
                         const std::vector<checkpoint::Piece>& pieces) {
    TESSERA_CHECK(static_cast<int>(pieces.size()) <= kMaxPieces,
                  "tessera hf: rank {} holds {} pieces of '{}' (at most {})", world.rank(), pieces.size(), name,
                  kMaxPieces);
    const auto owner = planBoxes(world, name, shape, pieces, dev);
    const auto full = collect(world, shape, pieces, owner, dev);
    if (!root) return;
    const auto t = full.to(scalarType(d));
    w->write(hf, t);
    bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
  };
  for (const auto& t : names) {
    if (t.hf.empty()) continue;  // the router's selection bias (familyOf refuses a model that moves it)
    const auto pieces = mine(t.name);
    if (t.hf.size() == 1) {
      gatherWrite(t.hf[0], t.name, t.shape, pieces);
    } else {
      const std::vector<int64_t> inner(t.shape.begin() + 1, t.shape.end());
      for (size_t e = 0; e < t.hf.size(); ++e) {
        gatherWrite(t.hf[e], t.name, inner, expertPieces(pieces, static_cast<int64_t>(e)));
      }
    }
    ++done;
    if (root && o.progressEvery > 0 && (done % static_cast<size_t>(o.progressEvery) == 0 || done == total)) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      log::info("tessera hf: export to {}: {}/{} tensors, {:.1f} MB, {:.1f} MB/s", hfDir, done, total,
                bytes / 1e6, bytes / 1e6 / std::max(s, 1e-9));
    }
  }
  if (root) {
    w->finish();
    writeHfSideFiles(c, base, source, hfDir, o);
    log::info("tessera hf: wrote {} ({} tensors, {})", hfDir, total, o.dtype);
  }
  world.barrier()->wait();
}

}  // namespace tessera::hf
