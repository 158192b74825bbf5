// Checkpoint pieces of tensor-parallel layers; see checkpoint_pieces.h.
#include "tessera/parallel/tensor/checkpoint_pieces.h"

#include <ATen/ATen.h>

namespace tessera::tp {
namespace {

using checkpoint::Piece;

void append(std::vector<Piece>& to, std::vector<Piece> from) {
  for (auto& p : from) to.push_back(std::move(p));
}

}  // namespace

std::vector<Piece> columnPieces(ColumnParallelLinearImpl& l, const std::string& name) {
  const int64_t r = l.tp->rank();
  std::vector<Piece> out{checkpoint::chunkOf(name + ".weight", l.weight.detach(), {l.out, l.in}, 0, r)};
  if (l.bias.defined()) out.push_back(checkpoint::chunkOf(name + ".bias", l.bias.detach(), {l.out}, 0, r));
  return out;
}

std::vector<Piece> rowPieces(RowParallelLinearImpl& l, const std::string& name) {
  const int64_t r = l.tp->rank();
  std::vector<Piece> out{checkpoint::chunkOf(name + ".weight", l.weight.detach(), {l.out, l.in}, 1, r)};
  if (l.bias.defined()) out.push_back(checkpoint::whole(name + ".bias", l.bias.detach()));
  return out;
}

std::vector<Piece> blockPieces(ParallelBlockImpl& b, const std::string& prefix) {
  std::vector<Piece> out;
  for (auto* ln : {&b.ln1, &b.ln2}) {
    const std::string n = prefix + (ln == &b.ln1 ? "ln1" : "ln2");
    out.push_back(checkpoint::whole(n + ".weight", (*ln)->weight.detach()));
    out.push_back(checkpoint::whole(n + ".bias", (*ln)->bias.detach()));
  }
  // qkv: this rank's [q_r | k_r | v_r] rows sit at j·d + r·d/tp of the unsharded [q | k | v].
  auto& qkv = *b.attn->qkv;
  const int64_t d = qkv.out / 3, rows = qkv.weight.size(0) / 3, r = qkv.tp->rank();
  for (int64_t j = 0; j < 3; ++j) {
    out.push_back({prefix + "qkv.weight", {qkv.out, qkv.in}, {j * d + r * rows, 0},
                   qkv.weight.detach().narrow(0, j * rows, rows)});
    if (qkv.bias.defined())
      out.push_back({prefix + "qkv.bias", {qkv.out}, {j * d + r * rows}, qkv.bias.detach().narrow(0, j * rows, rows)});
  }
  append(out, rowPieces(*b.attn->proj, prefix + "proj"));
  append(out, columnPieces(*b.mlp->fc1, prefix + "fc1"));
  append(out, rowPieces(*b.mlp->fc2, prefix + "fc2"));
  return out;
}

}  // namespace tessera::tp
