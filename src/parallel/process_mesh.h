#pragma once
// ProcessMesh: the world's ranks arranged as dp × pp × tp, tensor fastest-varying (as in
// Megatron-LM): rank = (d · pp + p) · tp + t. Each rank holds a communicator for each of its
// groups: the tp group (ranks differing only in t), the pp group (only in p), the dp group
// (only in d). A value: pass it where it is needed; there is no global mesh.
//
// Construction is collective over `world` (every rank must construct the same mesh) and
// throws tessera::Error when dp·pp·tp differs from the world size or a degree is < 1.
#include <array>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace tessera {

struct MeshCoord {
  int dp = 0, pp = 0, tp = 0;
  bool operator==(const MeshCoord& o) const { return dp == o.dp && pp == o.pp && tp == o.tp; }
};

enum class MeshAxis { Data, Pipeline, Tensor };

class ProcessMesh {
 public:
  ProcessMesh(CommPtr world, int dp, int pp, int tp);

  int dpSize() const { return dp_; }
  int ppSize() const { return pp_; }
  int tpSize() const { return tp_; }
  int rank() const { return world_->rank(); }
  MeshCoord coord() const { return coordOf(rank()); }

  // Pure functions of the shape (no communication).
  MeshCoord coordOf(int rank) const;
  int rankOf(const MeshCoord& c) const;
  // World ranks of this rank's group along `axis`, in group-rank order.
  std::vector<int> groupRanks(MeshAxis axis) const;

  const CommPtr& world() const { return world_; }
  const CommPtr& group(MeshAxis axis) const;
  const CommPtr& dpGroup() const { return group(MeshAxis::Data); }
  const CommPtr& ppGroup() const { return group(MeshAxis::Pipeline); }
  const CommPtr& tpGroup() const { return group(MeshAxis::Tensor); }

  std::string describe() const;  // "dp2 x pp2 x tp2, rank 5 = (dp 1, pp 0, tp 1)"

 private:
  CommPtr world_;
  int dp_, pp_, tp_;
  std::array<CommPtr, 3> groups_;
};

}  // namespace tessera
