#include "tessera/models/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/choice.h"
#include "tessera/common/error.h"

namespace tessera::models {

const char* toString(Arch a) { return a == Arch::Gpt ? "gpt" : "llama"; }

namespace {
constexpr Choices<Positions, 3> kPositions{
    "positions", {{{Positions::None, "none"}, {Positions::Learned, "learned"}, {Positions::Rope, "rope"}}}};
}  // namespace

const char* toString(Positions p) { return kPositions.name(p); }

namespace {
constexpr Choices<RouterScore, 2> kScores{
    "router score", {{{RouterScore::Softmax, "softmax"}, {RouterScore::Sigmoid, "sigmoid"}}}};
}  // namespace

const char* toString(RouterScore s) { return kScores.name(s); }

namespace {
constexpr Choices<QkNorm, 3> kQkNorms{
    "qk-norm", {{{QkNorm::None, "none"}, {QkNorm::PerHead, "per-head"}, {QkNorm::Whole, "whole"}}}};
}  // namespace

const char* toString(QkNorm q) { return kQkNorms.name(q); }
QkNorm parseQkNorm(const std::string& s) { return kQkNorms.parse(s); }
RouterScore parseRouterScore(const std::string& s) { return kScores.parse(s); }
Positions parsePositions(const std::string& s) { return kPositions.parse(s); }

namespace {
// The MoE presets, as their Hugging Face config.json gives them (max_position_embeddings as seq).
bool moePreset(const std::string& name, ModelConfig& c) {
  if (name == "olmoe-1b-7b") {  // allenai/OLMoE-1B-7B-0924
    c.d = 2048, c.layers = 16, c.heads = 16, c.kvHeads = 16, c.ffn = 1024, c.vocab = 50304, c.seqLen = 4096;
    c.qkNorm = QkNorm::Whole;
    c.moe = {.experts = 64, .topK = 8, .normTopK = false};
  } else if (name == "qwen3-30b-a3b") {  // Qwen/Qwen3-30B-A3B: head_dim 128, not d / heads = 64
    c.d = 2048, c.layers = 48, c.heads = 32, c.kvHeads = 4, c.ffn = 6144, c.vocab = 151936, c.seqLen = 40960;
    c.headSize = 128, c.normEps = 1e-6, c.ropeTheta = 1e6;
    c.qkNorm = QkNorm::PerHead;
    c.moe = {.experts = 128, .topK = 8, .expertFfn = 768, .normTopK = true};
  } else if (name == "mixtral-8x7b") {  // mistralai/Mixtral-8x7B-v0.1
    c.d = 4096, c.layers = 32, c.heads = 32, c.kvHeads = 8, c.ffn = 14336, c.vocab = 32000, c.seqLen = 32768;
    c.ropeTheta = 1e6;
    c.moe = {.experts = 8, .topK = 2, .normTopK = true};
  } else {
    return false;
  }
  return true;
}
}  // namespace

ModelConfig presetConfig(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    c.d = 64, c.layers = 4, c.heads = 4, c.vocab = 512, c.seqLen = 32;  // 512: tessera-prep's byte ids (0-257) fit
  } else if (name == "small") {
    c.d = 512, c.layers = 8, c.heads = 8, c.vocab = 8192, c.seqLen = 256;
  } else if (name == "735m") {
    c.d = 2048, c.layers = 12, c.heads = 16, c.vocab = 32000, c.seqLen = 1024;
    c.positions = Positions::None;  // as the anchors' GPT (../shared/anchors)
  } else if (name == "llama-tiny" || name == "moe-tiny" || name == "llama3-1b" || name == "llama3-8b") {
    c.arch = Arch::Llama;
    c.positions = Positions::Rope;
    if (name == "llama-tiny" || name == "moe-tiny") {
      c.d = 64, c.layers = 4, c.heads = 4, c.kvHeads = 2, c.ffn = 192, c.vocab = 4096, c.seqLen = 64;
      c.tiedEmbeddings = true;
      if (name == "moe-tiny") c.moe = {.experts = 8, .topK = 2, .expertFfn = 64, .sharedFfn = 64, .firstDense = 1};
    } else if (name == "llama3-1b") {
      c.d = 2048, c.layers = 16, c.heads = 32, c.kvHeads = 8, c.ffn = 8192, c.vocab = 128256, c.seqLen = 2048;
      c.tiedEmbeddings = true;
      c.ropeTheta = 500000;
      c.ropeScaling = {true, 32, 1, 4, 8192};
    } else {
      c.d = 4096, c.layers = 32, c.heads = 32, c.kvHeads = 8, c.ffn = 14336, c.vocab = 128256, c.seqLen = 8192;
      c.ropeTheta = 500000;
    }
  } else {
    c.arch = Arch::Llama;
    c.positions = Positions::Rope;
    if (!moePreset(name, c)) {
      throw Error(fmt::format("model: unknown preset '{}' ({})", name, fmt::join(presetNames(), ", ")));
    }
  }
  return c;
}

std::vector<std::string> presetNames() {
  return {"tiny",      "small",       "735m",          "llama-tiny",  "moe-tiny",
          "llama3-1b", "llama3-8b", "olmoe-1b-7b", "qwen3-30b-a3b", "mixtral-8x7b"};
}

void validate(const ModelConfig& c) {
  TESSERA_CHECK(c.d > 0 && c.layers > 0 && c.heads > 0 && c.vocab > 0 && c.seqLen > 0,
                "model: d {}, layers {}, heads {}, vocab {}, seq-len {} must all be > 0", c.d, c.layers, c.heads,
                c.vocab, c.seqLen);
  TESSERA_CHECK(c.headSize > 0 || c.d % c.heads == 0, "model: d = {} is not divisible by heads = {}", c.d, c.heads);
  TESSERA_CHECK(c.headSize >= 0 && (c.arch == Arch::Llama || c.headSize == 0),
                "model: head size {} must be >= 0 (0: d / heads), and the GPT's heads split d", c.headSize);
  TESSERA_CHECK(c.arch == Arch::Llama || c.qkNorm == QkNorm::None, "model: qk-norm '{}' needs the Llama block",
                toString(c.qkNorm));
  TESSERA_CHECK(c.kvH() <= c.heads && c.heads % c.kvH() == 0,
                "model: heads = {} is not a multiple of kv heads = {} (grouped-query attention)", c.heads, c.kvH());
  TESSERA_CHECK(c.arch == Arch::Llama || c.kvH() == c.heads, "model: the GPT has no grouped-query attention (kv heads {})",
                c.kvHeads);
  TESSERA_CHECK(c.arch == Arch::Gpt || c.positions == Positions::Rope,
                "model: Llama takes rotary positions, not '{}'", toString(c.positions));
  TESSERA_CHECK(c.positions != Positions::Rope || c.headDim() % 2 == 0,
                "model: rotary positions need an even head dimension ({})", c.headDim());
  TESSERA_CHECK(c.ffnSize() > 0, "model: FFN size {} must be > 0", c.ffn);
  TESSERA_CHECK(c.ropeTheta > 0, "model: rope theta {} must be > 0", c.ropeTheta);
  const auto& m = c.moe;
  if (m.experts == 0) return;
  TESSERA_CHECK(c.arch == Arch::Llama, "model: experts ({}) need the Llama block (arch llama)", m.experts);
  TESSERA_CHECK(m.experts > 0 && m.topK >= 1 && m.topK <= m.experts,
                "model: top-k {} must be in [1, experts = {}]", m.topK, m.experts);
  TESSERA_CHECK(m.expertFfn >= 0 && m.sharedFfn >= 0, "model: expert FFN {} and shared FFN {} must be >= 0",
                m.expertFfn, m.sharedFfn);
  TESSERA_CHECK(m.capacityFactor >= 0 && m.auxLossCoef >= 0 && m.zLossCoef >= 0 && m.biasUpdateRate >= 0,
                "model: capacity factor {}, aux-loss coefficient {}, z-loss coefficient {}, bias update rate {} "
                "must be >= 0", m.capacityFactor, m.auxLossCoef, m.zLossCoef, m.biasUpdateRate);
  TESSERA_CHECK(m.sparseStep >= 1 && m.firstDense >= 0, "model: sparse step {} must be >= 1, first dense layers {} >= 0",
                m.sparseStep, m.firstDense);
  for (int64_t l : m.denseLayers) {
    TESSERA_CHECK(l >= 0 && l < c.layers, "model: dense layer {} (mlp_only_layers) is not in [0, layers = {})", l,
                  c.layers);
  }
}

namespace {
// A Llama block's parameters with `experts` of the routed experts counted.
int64_t llamaBlock(const ModelConfig& c, int64_t layer, int64_t experts) {
  const int64_t q = c.heads * c.headDim(), kv = c.kvH() * c.headDim();
  const int64_t qkNorm = c.qkNorm == QkNorm::PerHead ? 2 * c.headDim() : c.qkNorm == QkNorm::Whole ? q + kv : 0;
  const int64_t attention = c.d * q * 2 + 2 * c.d * kv + 2 * c.d + qkNorm;
  if (!c.moe.sparse(layer)) return attention + 3 * c.d * c.ffnSize();
  return attention + c.moe.experts * c.d + 3 * c.d * (experts * c.expertFfn() + c.moe.sharedFfn);
}
}  // namespace

int64_t blockParamCount(const ModelConfig& c, int64_t layer) {
  if (c.arch == Arch::Gpt) return 4 * c.d * c.d + 2 * c.d * c.ffnSize() + 9 * c.d + c.ffnSize();
  return llamaBlock(c, layer, c.moe.experts);
}

int64_t activeBlockParamCount(const ModelConfig& c, int64_t layer) {
  return c.arch == Arch::Gpt ? blockParamCount(c, layer) : llamaBlock(c, layer, c.moe.topK);
}

int64_t paramCount(const ModelConfig& c) {
  const int64_t table = c.vocab * c.d;
  const int64_t finalNorm = c.arch == Arch::Gpt ? 2 * c.d : c.d;
  const int64_t pos = c.positions == Positions::Learned ? c.seqLen * c.d : 0;
  int64_t blocks = 0;
  for (int64_t l = 0; l < c.layers; ++l) blocks += blockParamCount(c, l);
  return blocks + table + (c.tiedEmbeddings ? 0 : table) + finalNorm + pos;
}

double flopsPerToken(const ModelConfig& c) {
  // The scores and their use per head width: H·hd (= d unless the head size is explicit).
  const double attention = 12.0 * static_cast<double>(c.layers * c.heads * c.headDim() * c.seqLen);
  if (c.arch == Arch::Gpt && !c.tiedEmbeddings) {
    const int64_t pos = c.positions == Positions::Learned ? c.seqLen * c.d : 0;
    return 6.0 * static_cast<double>(paramCount(c) - pos) + attention;
  }
  int64_t active = 0;
  for (int64_t l = 0; l < c.layers; ++l) active += activeBlockParamCount(c, l);
  const double multiplied = static_cast<double>(active + c.vocab * c.d);
  return 6.0 * multiplied + attention;
}

std::string ModelConfig::describe() const {
  std::string s = fmt::format("{} d {} layers {} heads {}", toString(arch), d, layers, heads);
  if (arch == Arch::Llama) s += fmt::format(" kv heads {} ffn {}", kvH(), ffnSize());
  if (headSize > 0) s += fmt::format(" head size {}", headSize);
  if (qkNorm != QkNorm::None) s += fmt::format(" qk-norm {}", toString(qkNorm));
  s += fmt::format(" vocab {} T {}, {} positions", vocab, seqLen, toString(positions));
  if (positions == Positions::Rope) {
    s += fmt::format(" (theta {:g}{})", ropeTheta,
                     ropeScaling.enabled ? fmt::format(", llama3 scaling x{:g}", ropeScaling.factor) : "");
  }
  if (tiedEmbeddings) s += ", tied embeddings";
  if (moe.experts > 0) {
    s += fmt::format(", {} experts of ffn {} top {}{}", moe.experts, expertFfn(), moe.topK,
                     moe.sharedFfn > 0 ? fmt::format(" + shared ffn {}", moe.sharedFfn) : "");
  }
  return s + fmt::format(" ({:.1f} M parameters)", paramCount(*this) / 1e6);
}

std::string ModelConfig::signature() const {
  return fmt::format("{} d {} layers {} heads {} kv {} ffn {} vocab {} positions {}{} tied {}", toString(arch), d,
                     layers, heads, kvH(), ffnSize(), vocab, toString(positions),
                     positions == Positions::Learned ? fmt::format(" T {}", seqLen) : "", tiedEmbeddings) +
         (moe.experts > 0 ? fmt::format(" experts {} expert-ffn {} shared-ffn {} first-dense {} sparse-step {}",
                                        moe.experts, expertFfn(), moe.sharedFfn, moe.firstDense, moe.sparseStep)
                          : "") +
         (moe.experts > 0 && !moe.denseLayers.empty() ? fmt::format(" dense-layers {}", fmt::join(moe.denseLayers, ","))
                                                      : "") +
         (headSize > 0 ? fmt::format(" head-size {}", headSize) : "") +
         (qkNorm != QkNorm::None ? fmt::format(" qk-norm {}", toString(qkNorm)) : "");
}

}  // namespace tessera::models
