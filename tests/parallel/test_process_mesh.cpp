// ProcessMesh: coordinates (pure) and the dp/pp/tp communicators (8 ranks as 2x2x2, and
// other shapes), checked by collectives over each group against the group's known ranks; with
// context parallel (DxPxCxT) also the cp group and the data group (dp x cp); with a suffix eN
// (expert parallel) the ep and expert-data groups folded into the data group.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/multiprocess.h"
#include "tessera/parallel/process_mesh.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
std::vector<int> parseShape(const std::string& s) {
  std::vector<int> v;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find('x', p);
    v.push_back(std::stoi(s.substr(p, q - p)));
    p = q == std::string::npos ? s.size() : q + 1;
  }
  return v;
}
}  // namespace

// The world ranks of `g`'s members, in group-rank order (an all-gather over it).
std::vector<int64_t> members(const CommPtr& g, int rank) {
  auto all = at::empty({g->size()}, at::kLong);
  g->allGather(all, at::full({1}, static_cast<int64_t>(rank), at::kLong))->synchronize();
  return {all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel()};
}

// Expert parallel: ep groups of consecutive data-group places, expert-data groups of equal place mod ep.
void checkExpertGroups(const ProcessMesh& mesh, int ep, int rank) {
  auto data = members(mesh.dataGroup(), rank);
  const int i = mesh.dataGroup()->rank();
  std::vector<int64_t> wantEp, wantEdp;
  for (int k = 0; k < static_cast<int>(data.size()); ++k) {
    if (k / ep == i / ep) wantEp.push_back(data[k]);
    if (k % ep == i % ep) wantEdp.push_back(data[k]);
  }
  WCHECK(mesh.epSize() == ep && (ep > 1) == (mesh.expertGroup() != nullptr), "ep {} but epSize {}", ep, mesh.epSize());
  if (ep > 1) WCHECK(members(mesh.expertGroup(), rank) == wantEp, "rank {}: the ep group's members differ", rank);
  WCHECK(members(mesh.expertDataGroup(), rank) == wantEdp, "rank {}: the expert-data group's members differ", rank);
}

TESSERA_WORKER(mesh_groups) {
  const auto e = w.arg.find('e');
  const int ep = e == std::string::npos ? 1 : std::stoi(w.arg.substr(e + 1));
  auto shape = parseShape(w.arg.substr(0, e));
  int dp = shape[0], pp = shape[1], cp = shape.size() == 4 ? shape[2] : 1, tp = shape.back();
  const bool withCp = cp > 1;
  auto ctx = initWorker(w);
  ProcessMesh mesh =
      shape.size() == 4 ? ProcessMesh(ctx.world, dp, pp, tp, cp, ep) : ProcessMesh(ctx.world, dp, pp, tp);
  checkExpertGroups(mesh, ep, w.rank);
  auto c = mesh.coord();
  // tp fastest-varying, then cp: rank = ((d*pp + p)*cp + c)*tp + t.
  WCHECK(w.rank == ((c.dp * pp + c.pp) * cp + c.cp) * tp + c.tp, "rank {} has coord ({},{},{},{})", w.rank, c.dp, c.pp,
         c.cp, c.tp);
  WCHECK(mesh.rankOf(c) == w.rank, "rankOf(coordOf({})) = {}", w.rank, mesh.rankOf(c));
  WCHECK(withCp || !mesh.cpGroup(), "a cp group without context parallelism");
  std::vector<std::pair<MeshAxis, const char*>> axes = {
      {MeshAxis::Data, "dp"}, {MeshAxis::Pipeline, "pp"}, {MeshAxis::Tensor, "tp"}};
  if (withCp) axes.push_back({MeshAxis::Context, "cp"});
  // The data group: d and c vary, d-major (dp x cp replicas of the gradients).
  {
    std::vector<int> want;
    for (int d = 0; d < dp; ++d)
      for (int k = 0; k < cp; ++k) want.push_back(mesh.rankOf(MeshCoord{d, c.pp, c.tp, k}));
    auto& g = mesh.dataGroup();
    auto mine = at::full({1}, static_cast<int64_t>(w.rank), at::kLong);
    auto all = at::empty({g->size()}, at::kLong);
    g->allGather(all, mine)->synchronize();
    WCHECK(g->size() == dp * cp, "data group of {} ranks, want {}", g->size(), dp * cp);
    for (int k = 0; k < g->size(); ++k)
      WCHECK(all[k].item<int64_t>() == want[k], "data group member {} is world rank {}, want {}", k,
             all[k].item<int64_t>(), want[k]);
  }
  for (auto [axis, name] : axes) {
    auto& g = mesh.group(axis);
    auto ranks = mesh.groupRanks(axis);
    WCHECK(g && g->size() == static_cast<int>(ranks.size()), "{} group size {} vs {}", name, g ? g->size() : -1,
           ranks.size());
    WCHECK(ranks[g->rank()] == w.rank, "{} group rank {} maps to world {} not {}", name, g->rank(), ranks[g->rank()],
           w.rank);
    // The all-gather over the group returns exactly the world ranks the mesh says.
    auto mine = at::full({1}, static_cast<int64_t>(w.rank), at::kLong);
    auto all = at::empty({g->size()}, at::kLong);
    g->allGather(all, mine)->synchronize();
    for (int k = 0; k < g->size(); ++k) {
      WCHECK(all[k].item<int64_t>() == ranks[k], "{} group member {} is world rank {}, mesh says {}", name, k,
             all[k].item<int64_t>(), ranks[k]);
    }
    // And an all-reduce sums over that group only.
    auto s = at::full({1}, static_cast<int64_t>(w.rank), at::kLong);
    g->allReduce(s)->synchronize();
    int64_t want = 0;
    for (int r : ranks) want += r;
    WCHECK(s.item<int64_t>() == want, "{} all-reduce gave {} want {}", name, s.item<int64_t>(), want);
  }
  fmt::print("rank {}: {}\n", w.rank, mesh.describe());
}

class MeshShapes : public ::testing::TestWithParam<std::pair<int, const char*>> {};

TEST_P(MeshShapes, GroupsHoldTheRanksTheCoordinatesSay) {
  auto [ranks, shape] = GetParam();
  expectAllOk(runWorkers("mesh_groups", {.ranks = ranks, .timeout = std::chrono::seconds(120), .arg = shape}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MeshShapes,
                         ::testing::Values(std::make_pair(8, "2x2x2"), std::make_pair(8, "1x2x4"),
                                           std::make_pair(8, "4x1x1x2e2"), std::make_pair(4, "2x1x2"),
                                           std::make_pair(1, "1x1x1"), std::make_pair(8, "2x1x2x2e4"),
                                           std::make_pair(8, "1x2x4x1"), std::make_pair(4, "1x1x2x2")));

TESSERA_WORKER(mesh_bad_shape) {
  auto ctx = initWorker(w);
  expectErrorContaining([&] { ProcessMesh mesh(ctx.world, 2, 2, 2); },
                        {"dp 2 x pp 2 x tp 2 = 8 does not match the world size 4", "rank"});
  expectErrorContaining([&] { ProcessMesh mesh(ctx.world, 4, 1, 1, 1, 3); },
                        {"expert-parallel size 3 must divide", "dp 4 x cp 1 = 4"});
}

TEST(ProcessMesh, ShapeNotMatchingWorldIsAClearError) { expectAllOk(runWorkers("mesh_bad_shape", {.ranks = 4})); }
