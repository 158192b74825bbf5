#include "parallel/process_mesh.h"

#include <fmt/format.h>

#include "common/error.h"

namespace tessera {

ProcessMesh::ProcessMesh(CommPtr world, int dp, int pp, int tp) : world_(std::move(world)), dp_(dp), pp_(pp), tp_(tp) {
  TESSERA_CHECK(world_, "ProcessMesh: no world communicator given");
  TESSERA_CHECK(dp >= 1 && pp >= 1 && tp >= 1, "ProcessMesh: degrees must be >= 1, got dp={} pp={} tp={}", dp, pp, tp);
  TESSERA_CHECK(dp * pp * tp == world_->size(),
                "ProcessMesh: dp {} x pp {} x tp {} = {} does not match the world size {} (rank {})", dp, pp, tp,
                dp * pp * tp, world_->size(), world_->rank());
  auto me = coord();
  // Color = the coordinates that stay fixed along the axis; key = the coordinate that varies.
  groups_[static_cast<int>(MeshAxis::Tensor)] =
      world_->split(me.dp * pp_ + me.pp, me.tp, fmt::format("tp[dp{},pp{}]", me.dp, me.pp));
  groups_[static_cast<int>(MeshAxis::Pipeline)] =
      world_->split(me.dp * tp_ + me.tp, me.pp, fmt::format("pp[dp{},tp{}]", me.dp, me.tp));
  groups_[static_cast<int>(MeshAxis::Data)] =
      world_->split(me.pp * tp_ + me.tp, me.dp, fmt::format("dp[pp{},tp{}]", me.pp, me.tp));
}

MeshCoord ProcessMesh::coordOf(int rank) const {
  TESSERA_CHECK(rank >= 0 && rank < dp_ * pp_ * tp_, "ProcessMesh: rank {} is outside the mesh of {}", rank,
                dp_ * pp_ * tp_);
  return MeshCoord{rank / (pp_ * tp_), (rank / tp_) % pp_, rank % tp_};
}

int ProcessMesh::rankOf(const MeshCoord& c) const {
  TESSERA_CHECK(c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_ && c.tp >= 0 && c.tp < tp_,
                "ProcessMesh: coordinate (dp {}, pp {}, tp {}) is outside dp{} x pp{} x tp{}", c.dp, c.pp, c.tp, dp_,
                pp_, tp_);
  return (c.dp * pp_ + c.pp) * tp_ + c.tp;
}

std::vector<int> ProcessMesh::groupRanks(MeshAxis axis) const {
  auto me = coord();
  std::vector<int> out;
  int n = axis == MeshAxis::Data ? dp_ : axis == MeshAxis::Pipeline ? pp_ : tp_;
  for (int k = 0; k < n; ++k) {
    auto c = me;
    (axis == MeshAxis::Data ? c.dp : axis == MeshAxis::Pipeline ? c.pp : c.tp) = k;
    out.push_back(rankOf(c));
  }
  return out;
}

const CommPtr& ProcessMesh::group(MeshAxis axis) const { return groups_[static_cast<int>(axis)]; }

std::string ProcessMesh::describe() const {
  auto c = coord();
  return fmt::format("dp{} x pp{} x tp{}, rank {} = (dp {}, pp {}, tp {})", dp_, pp_, tp_, rank(), c.dp, c.pp, c.tp);
}

}  // namespace tessera
