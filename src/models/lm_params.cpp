// A chunk's parts and parameters (see lm.h): which tensors each part (embedding, blocks, final
// norm, head) owns, how they are named, replicated or tied, and their checkpoint pieces. The
// construction and forward are in lm.cpp.
#include <fmt/format.h>

#include "tessera/models/lm.h"
#include "tessera/parallel/tensor/checkpoint_pieces.h"

namespace tessera::models {

std::vector<ModelPart> LmChunkImpl::parts() {
  std::vector<ModelPart> out;
  // A tied table on the first and the last stage: two copies, their gradients summed over the
  // embedding group and counted once.
  const int copies = cfg.tiedEmbeddings && !(first && last) ? 2 : 1;
  if (first) {
    out.push_back({"emb", [this](const at::Tensor& t) { return embed(t); },
                   {{"emb.weight", emb->weight, false, -1, 1, copies}}});
  }
  if (pos.defined()) {
    out.push_back({"pos", [this](const at::Tensor& x) { return addPositions(x); }, {{"pos.weight", pos, true}}});
  }
  for (size_t k = 0; k < blocks.size(); ++k) {
    const int i = range.firstBlock + static_cast<int>(k);
    out.push_back({fmt::format("block{}", i), [this, k](const at::Tensor& x) { return block(k, x); },
                   blocks[k]->params(fmt::format("blocks.{}.", i))});
  }
  if (last) {
    out.push_back({"norm", [this](const at::Tensor& x) { return norm->forward(x); }, norm->params("")});
    ModelPart h{"head", [this](const at::Tensor& x) { return logits(x); }, {}};
    if (headTable.defined()) {
      h.params = {{"emb.weight", headTable, false, -1, 1, copies}};
    } else if (head) {
      h.params = {{"head.weight", head->weight}};
    } else {
      h.sharesParamsOf = 0;  // tied on one stage: the embedding's table
    }
    out.push_back(std::move(h));
  }
  return out;
}

std::vector<NamedParam> LmChunkImpl::params() {
  std::vector<NamedParam> out;
  for (auto& part : parts()) {
    for (auto& p : part.params) out.push_back(std::move(p));
  }
  return out;
}

std::vector<checkpoint::Piece> LmChunkImpl::pieces() {
  std::vector<checkpoint::Piece> out;
  auto add = [&](std::vector<checkpoint::Piece> ps) {
    for (auto& p : ps) out.push_back(std::move(p));
  };
  const int64_t r = tp->rank();
  if (first) out.push_back(checkpoint::chunkOf("emb.weight", emb->weight.detach(), {cfg.vocab, cfg.d}, 0, r));
  if (pos.defined()) out.push_back(checkpoint::whole("pos.weight", pos.detach()));
  for (size_t k = 0; k < blocks.size(); ++k) {
    add(blocks[k]->pieces(fmt::format("blocks.{}.", range.firstBlock + static_cast<int>(k))));
  }
  if (last) {
    add(norm->pieces(""));
    if (!cfg.tiedEmbeddings) add(tp::columnPieces(*head, "head"));
    if (headTable.defined()) out.push_back(checkpoint::chunkOf("emb.weight", headTable.detach(), {cfg.vocab, cfg.d}, 0, r));
  }
  return out;
}

}  // namespace tessera::models
