// A pipeline chunk's parameters by part (see lm.h): which tensors each part (embedding, blocks,
// final norm, head) owns, how they are named, replicated or tied, and the FSDP units and
// checkpoint pieces built from them. The construction and forward are in lm.cpp.
#include <fmt/format.h>

#include "models/lm.h"
#include "parallel/tensor/checkpoint_pieces.h"

namespace tessera::models {

namespace {
// "attn.qkv.weight" → "qkv.weight" (the unsharded GPT block's names, as loadFull and blockPieces).
std::string flatBlockName(const std::string& n) {
  for (const char* pre : {"attn.", "mlp."}) {
    if (n.rfind(pre, 0) == 0) return n.substr(std::string(pre).size());
  }
  return n;
}
bool gptParamReplicated(const std::string& flat) {
  return flat.rfind("ln1.", 0) == 0 || flat.rfind("ln2.", 0) == 0 || flat == "proj.bias" || flat == "fc2.bias";
}
}  // namespace

std::vector<std::pair<std::string, std::function<std::vector<ChunkParam>()>>> LmChunkImpl::partParams() {
  std::vector<std::pair<std::string, std::function<std::vector<ChunkParam>()>>> out;
  const int copies = cfg.tiedEmbeddings && !(first && last) ? 2 : 1;
  if (first) {
    out.emplace_back("emb", [this, copies] {
      return std::vector<ChunkParam>{{"emb.weight", emb->weight, false, -1, 1, copies}};
    });
  }
  if (pos.defined()) out.emplace_back("pos", [this] { return std::vector<ChunkParam>{{"pos.weight", pos, true}}; });
  for (int i = firstBlock; i < endBlock; ++i) {
    out.emplace_back(fmt::format("block{}", i), [this, i] {
      const auto prefix = fmt::format("blocks.{}.", i);
      if (cfg.arch == Arch::Llama) return llamaBlocks[i - firstBlock]->params(prefix);
      std::vector<ChunkParam> ps;
      for (const auto& kv : gptBlocks[i - firstBlock]->named_parameters()) {
        const auto flat = flatBlockName(kv.key());
        ps.push_back({prefix + flat, kv.value(), gptParamReplicated(flat)});
      }
      return ps;
    });
  }
  if (last) {
    out.emplace_back("norm", [this] {
      if (cfg.arch == Arch::Llama) return std::vector<ChunkParam>{{"norm.weight", norm->weight, true}};
      return std::vector<ChunkParam>{{"lnf.weight", lnf->weight, true}, {"lnf.bias", lnf->bias, true}};
    });
    if (!headInEmbUnit()) {
      out.emplace_back("head", [this, copies] {
        if (headTable.defined()) return std::vector<ChunkParam>{{"emb.weight", headTable, false, -1, 1, copies}};
        return std::vector<ChunkParam>{{"head.weight", head->weight}};
      });
    }
  }
  return out;
}

std::vector<FsdpUnitSpec> LmChunkImpl::fsdpUnits() {
  std::vector<FsdpUnitSpec> units;
  for (const auto& [name, get] : partParams()) {
    FsdpUnitSpec u;
    u.name = fmt::format("stage{}.{}", stage, name);
    for (const auto& p : get()) u.params.emplace_back(p.name, p.tensor);
    if (name == "emb" && headInEmbUnit()) u.reshardAfterForward = false;  // run first and last
    // The head runs last in forward and first in backward: kept gathered in between rather than
    // gathered again (its 1 GB all-gather on llama3-8b waited in front of backward), as FSDP2
    // keeps its root.
    if (name == "head") u.reshardAfterForward = false;
    units.push_back(std::move(u));
  }
  return units;
}

std::vector<size_t> LmChunkImpl::partUnits() {
  const size_t n = partParams().size();
  std::vector<size_t> out(n);
  for (size_t k = 0; k < n; ++k) out[k] = k;
  if (headInEmbUnit()) out.push_back(0);  // the head part runs in the emb unit
  return out;
}

int LmChunkImpl::tiedUnit() {
  if (!cfg.tiedEmbeddings || !(first || last)) return -1;
  return first ? 0 : static_cast<int>(partParams().size()) - 1;
}

std::vector<ChunkParam> LmChunkImpl::params() {
  std::vector<ChunkParam> out;
  for (const auto& [name, get] : partParams()) {
    for (auto& p : get()) out.push_back(std::move(p));
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
  for (int i = firstBlock; i < endBlock; ++i) {
    const auto prefix = fmt::format("blocks.{}.", i);
    add(cfg.arch == Arch::Llama ? llamaBlocks[i - firstBlock]->pieces(prefix) : tp::blockPieces(*gptBlocks[i - firstBlock], prefix));
  }
  if (last) {
    if (cfg.arch == Arch::Llama) {
      out.push_back(checkpoint::whole("norm.weight", norm->weight.detach()));
    } else {
      out.push_back(checkpoint::whole("lnf.weight", lnf->weight.detach()));
      out.push_back(checkpoint::whole("lnf.bias", lnf->bias.detach()));
    }
    if (!cfg.tiedEmbeddings) add(tp::columnPieces(*head, "head"));
    if (headTable.defined()) out.push_back(checkpoint::chunkOf("emb.weight", headTable.detach(), {cfg.vocab, cfg.d}, 0, r));
  }
  return out;
}

}  // namespace tessera::models
