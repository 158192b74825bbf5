#include "parallel/data_parallel/pieces.h"

#include <algorithm>

#include "tessera/common/error.h"

namespace tessera::dp {

size_t paramOf(const at::Tensor& local, const std::vector<NamedParam>& params, const std::string& what) {
  const int64_t o = local.storage_offset();
  for (size_t k = 0; k < params.size(); ++k) {
    const auto& P = params[k].tensor;
    if (local.is_alias_of(P) && o >= P.storage_offset() && o < P.storage_offset() + P.numel()) return k;
  }
  throw Error(fmt::format("{} is no parameter's view", what));
}

at::Tensor sameBox(const at::Tensor& local, const at::Tensor& param, const at::Tensor& base, int64_t baseOffset) {
  return base.as_strided(local.sizes(), local.strides(),
                         base.storage_offset() + baseOffset + (local.storage_offset() - param.storage_offset()));
}

std::vector<checkpoint::Piece> trainingPieces(const std::vector<checkpoint::Piece>& modelPieces,
                                              const std::vector<NamedParam>& params, const ViewFn& view) {
  std::vector<checkpoint::Piece> out;
  for (const auto& piece : modelPieces) {
    if (piece.state) {
      out.push_back(piece);
      continue;
    }
    const size_t k = paramOf(piece.local, params, fmt::format("checkpoint piece '{}'", piece.name));
    int what = 0;
    for (const char* prefix : {"", "optim.exp_avg.", "optim.exp_avg_sq."}) {
      out.push_back({prefix + piece.name, piece.globalShape, piece.offset, view(piece, k, what++)});
    }
  }
  return out;
}

void addGradPieces(std::vector<GradPiece>& out, const at::Tensor& flat, int64_t begin, const NamedParam& p, int tp) {
  const double w = (p.replicatedOverTp ? 1.0 / tp : 1.0) / p.ppCopies;
  const int64_t end = begin + flat.numel();
  if (p.replicatedFrom < 0 || p.replicatedFrom >= end) {
    out.push_back({flat, w});
    return;
  }
  const int64_t cut = std::max(begin, p.replicatedFrom);
  if (cut > begin) out.push_back({flat.narrow(0, 0, cut - begin), w});
  out.push_back({flat.narrow(0, cut - begin, end - cut), w / p.replicas});
}

std::vector<NamedParam> allParams(const std::vector<std::vector<ModelPart>>& chunks) {
  std::vector<NamedParam> out;
  for (const auto& c : chunks) {
    for (const auto& part : c) out.insert(out.end(), part.params.begin(), part.params.end());
  }
  return out;
}

}  // namespace tessera::dp
