#pragma once
// ProcessMesh: the world's ranks arranged as dp × pp × cp × tp, tensor fastest-varying (as in
// Megatron-LM), context parallel next to it: rank = ((d · pp + p) · cp + c) · tp + t. Each rank
// holds a communicator for each of its groups: the tp group (ranks differing only in t), the cp
// group (only in c), the pp group (only in p), the dp group (only in d), and the data group (in d
// and c: the ranks whose gradients are averaged, since a cp rank holds a share of every sequence
// of its replica; parallel/context/). A value: pass it where it is needed; there is no global mesh.
//
// With cp = 1 (the default) the mesh is dp × pp × tp exactly as before: no cp group (null), the
// data group is the dp group, and the groups keep their names ("tp[dp0,pp1]", ...). Expert
// parallel (ep > 1, dividing dp·cp) folds into the data group: its ranks i = d·cp + c form ep
// groups of consecutive i (the experts split over them) and expert-data groups of equal i mod ep
// (the ranks holding the same experts, whose gradients are averaged). Construction is collective
// over `world` (every rank must construct the same mesh) and throws tessera::Error when dp·pp·cp·tp
// differs from the world size, a degree is < 1 or ep does not divide dp·cp.
#include <array>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera {

struct MeshCoord {
  int dp = 0, pp = 0, tp = 0, cp = 0;
  bool operator==(const MeshCoord& o) const { return dp == o.dp && pp == o.pp && tp == o.tp && cp == o.cp; }
};

enum class MeshAxis { Data, Pipeline, Tensor, Context };

class ProcessMesh {
 public:
  ProcessMesh(CommPtr world, int dp, int pp, int tp, int cp = 1, int ep = 1);

  int dpSize() const { return dp_; }
  int ppSize() const { return pp_; }
  int tpSize() const { return tp_; }
  int cpSize() const { return cp_; }
  int epSize() const { return ep_; }
  int rank() const { return world_->rank(); }
  MeshCoord coord() const { return coordOf(rank()); }

  // Pure functions of the shape (no communication).
  MeshCoord coordOf(int rank) const;
  int rankOf(const MeshCoord& c) const;
  // World ranks of this rank's group along `axis`, in group-rank order.
  std::vector<int> groupRanks(MeshAxis axis) const;

  const CommPtr& world() const { return world_; }
  const CommPtr& group(MeshAxis axis) const;  // Context: null when cp = 1
  const CommPtr& dpGroup() const { return group(MeshAxis::Data); }
  const CommPtr& ppGroup() const { return group(MeshAxis::Pipeline); }
  const CommPtr& tpGroup() const { return group(MeshAxis::Tensor); }
  const CommPtr& cpGroup() const { return group(MeshAxis::Context); }
  // dp × cp (rank order: d-major, then c): where gradients are averaged. The dp group when cp = 1.
  const CommPtr& dataGroup() const { return cp_ > 1 ? dataGroup_ : dpGroup(); }
  // The ep ranks of this rank's data group that split the experts (null when ep = 1), and the
  // ranks of the data group holding the same experts as this one (the data group when ep = 1).
  const CommPtr& expertGroup() const { return expertGroup_; }
  const CommPtr& expertDataGroup() const { return ep_ > 1 ? expertDataGroup_ : dataGroup(); }

  std::string describe() const;  // "dp2 x pp2 x tp2, rank 5 = (dp 1, pp 0, tp 1)" (cp, ep when > 1)

 private:
  CommPtr world_;
  int dp_, pp_, tp_, cp_, ep_;
  std::array<CommPtr, 4> groups_;
  CommPtr dataGroup_, expertGroup_, expertDataGroup_;
};

}  // namespace tessera
