#include "tessera/parallel/process_mesh.h"

#include <fmt/format.h>

#include "tessera/common/error.h"

namespace tessera {

ProcessMesh::ProcessMesh(CommPtr world, int dp, int pp, int tp, int cp, int ep)
    : world_(std::move(world)), dp_(dp), pp_(pp), tp_(tp), cp_(cp), ep_(ep) {
  TESSERA_CHECK(world_, "ProcessMesh: no world communicator given");
  TESSERA_CHECK(dp >= 1 && pp >= 1 && tp >= 1 && cp >= 1 && ep >= 1,
                "ProcessMesh: degrees must be >= 1, got dp={} pp={} cp={} tp={} ep={}", dp, pp, cp, tp, ep);
  TESSERA_CHECK((dp * cp) % ep == 0,
                "ProcessMesh: the expert-parallel size {} must divide the data-parallel ranks dp {} x cp {} = {}", ep,
                dp, cp, dp * cp);
  TESSERA_CHECK(dp * pp * cp * tp == world_->size(), "ProcessMesh: dp {} x pp {}{} x tp {} = {} does not match the world size {} (rank {})",
                dp, pp, cp > 1 ? fmt::format(" x cp {}", cp) : "", tp, dp * pp * cp * tp, world_->size(), world_->rank());
  const auto me = coord();
  // Color = the coordinates that stay fixed along the axis; key = the coordinate that varies.
  // With cp = 1 the colors, keys and names are those of the dp × pp × tp mesh.
  const std::string c = cp_ > 1 ? fmt::format(",cp{}", me.cp) : "";
  groups_[static_cast<int>(MeshAxis::Tensor)] = world_->split((me.dp * pp_ + me.pp) * cp_ + me.cp, me.tp,
                                                              fmt::format("tp[dp{},pp{}{}]", me.dp, me.pp, c));
  groups_[static_cast<int>(MeshAxis::Pipeline)] = world_->split((me.dp * cp_ + me.cp) * tp_ + me.tp, me.pp,
                                                                fmt::format("pp[dp{},tp{}{}]", me.dp, me.tp, c));
  groups_[static_cast<int>(MeshAxis::Data)] = world_->split((me.pp * cp_ + me.cp) * tp_ + me.tp, me.dp,
                                                            fmt::format("dp[pp{},tp{}{}]", me.pp, me.tp, c));
  if (cp_ > 1) {
    groups_[static_cast<int>(MeshAxis::Context)] = world_->split((me.dp * pp_ + me.pp) * tp_ + me.tp, me.cp,
                                                                 fmt::format("cp[dp{},pp{},tp{}]", me.dp, me.pp, me.tp));
    dataGroup_ = world_->split(me.pp * tp_ + me.tp, me.dp * cp_ + me.cp, fmt::format("dpcp[pp{},tp{}]", me.pp, me.tp));
  }
  if (ep_ > 1) {  // i: the rank's place in its data group
    const int i = me.dp * cp_ + me.cp, fixed = me.pp * tp_ + me.tp, n = pp_ * tp_;
    expertGroup_ = world_->split((i / ep_) * n + fixed, i % ep_, fmt::format("ep[pp{},tp{},{}]", me.pp, me.tp, i / ep_));
    expertDataGroup_ =
        world_->split((i % ep_) * n + fixed, i / ep_, fmt::format("edp[pp{},tp{},{}]", me.pp, me.tp, i % ep_));
  }
}

MeshCoord ProcessMesh::coordOf(int rank) const {
  const int n = dp_ * pp_ * cp_ * tp_;
  TESSERA_CHECK(rank >= 0 && rank < n, "ProcessMesh: rank {} is outside the mesh of {}", rank, n);
  MeshCoord m;
  m.tp = rank % tp_;
  m.cp = (rank / tp_) % cp_;
  m.pp = (rank / (tp_ * cp_)) % pp_;
  m.dp = rank / (tp_ * cp_ * pp_);
  return m;
}

int ProcessMesh::rankOf(const MeshCoord& c) const {
  TESSERA_CHECK(c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_ && c.tp >= 0 && c.tp < tp_ && c.cp >= 0 && c.cp < cp_,
                "ProcessMesh: coordinate (dp {}, pp {}, cp {}, tp {}) is outside dp{} x pp{} x cp{} x tp{}", c.dp, c.pp,
                c.cp, c.tp, dp_, pp_, cp_, tp_);
  return ((c.dp * pp_ + c.pp) * cp_ + c.cp) * tp_ + c.tp;
}

std::vector<int> ProcessMesh::groupRanks(MeshAxis axis) const {
  const auto me = coord();
  std::vector<int> out;
  const int n = axis == MeshAxis::Data ? dp_ : axis == MeshAxis::Pipeline ? pp_ : axis == MeshAxis::Tensor ? tp_ : cp_;
  for (int k = 0; k < n; ++k) {
    auto c = me;
    (axis == MeshAxis::Data ? c.dp : axis == MeshAxis::Pipeline ? c.pp : axis == MeshAxis::Tensor ? c.tp : c.cp) = k;
    out.push_back(rankOf(c));
  }
  return out;
}

const CommPtr& ProcessMesh::group(MeshAxis axis) const { return groups_[static_cast<int>(axis)]; }

std::string ProcessMesh::describe() const {
  const auto c = coord();
  const std::string ep = ep_ > 1 ? fmt::format(" (ep {} of the data ranks)", ep_) : "";
  if (cp_ == 1)
    return fmt::format("dp{} x pp{} x tp{}{}, rank {} = (dp {}, pp {}, tp {})", dp_, pp_, tp_, ep, rank(), c.dp, c.pp,
                       c.tp);
  return fmt::format("dp{} x pp{} x cp{} x tp{}{}, rank {} = (dp {}, pp {}, cp {}, tp {})", dp_, pp_, cp_, tp_, ep,
                     rank(), c.dp, c.pp, c.cp, c.tp);
}

}  // namespace tessera
