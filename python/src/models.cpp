// tessera._C.models: the C++ definitions the Python Llama (tessera.llama) shares with train_gpt, so
// that both read one source: the model presets (src/models/config.h) and the pipeline's split of
// the blocks (src/train/model_spec.h).
#include <pybind11/stl.h>

#include <map>
#include <string>

#include "bindings.h"
#include "tessera/models/config.h"
#include "tessera/models/lm.h"
#include "tessera/train/model_spec.h"

namespace tessera::py {

pb::dict configDict(const models::ModelConfig& c) {
  pb::dict d;
  d["d"] = c.d;
  d["layers"] = c.layers;
  d["heads"] = c.heads;
  d["kv_heads"] = c.kvH();
  d["ffn"] = c.ffnSize();
  d["vocab"] = c.vocab;
  d["seq_len"] = c.seqLen;
  d["rope_theta"] = c.ropeTheta;
  const auto& s = c.ropeScaling;
  d["rope_scaling"] = s.enabled ? pb::object(pb::dict(pb::arg("factor") = s.factor, pb::arg("low") = s.lowFreqFactor,
                                                      pb::arg("high") = s.highFreqFactor,
                                                      pb::arg("original") = s.originalMaxPositions))
                                : pb::object(pb::none());
  d["tied"] = c.tiedEmbeddings;
  d["norm_eps"] = c.normEps;
  return d;
}

void bindModels(pb::module_& m) {
  auto mm = m.def_submodule("models", "train_gpt's model presets and stage split (see tessera.llama)");
  mm.def("preset_names", &models::presetNames);
  mm.def(
      "preset",
      [](const std::string& name) {
        const auto c = models::presetConfig(name);
        pb::dict d = configDict(c);
        d["arch"] = models::toString(c.arch);
        d["positions"] = models::toString(c.positions);
        // What tessera/llama.py's plain Llama cannot express (it refuses such presets by this description).
        d["plain_llama"] = c.qkNorm == models::QkNorm::None && c.headSize == 0 && c.moe.experts == 0;
        d["describe"] = c.describe();
        return d;
      },
      pb::arg("name"), "A preset's fields (an unknown name is a tessera.Error listing the presets)");
  mm.def(
      "partition",
      [](int64_t d, int64_t layers, int64_t heads, int64_t kvHeads, int64_t ffn, int64_t vocab, int pp) {
        models::ModelConfig c;
        c.arch = models::Arch::Llama;
        c.positions = models::Positions::Rope;
        c.d = d, c.layers = layers, c.heads = heads, c.kvHeads = kvHeads, c.ffn = ffn, c.vocab = vocab;
        const auto part = train::partitionModel(c, pp, 1, {});
        std::vector<std::pair<int, int>> out;
        for (int s = 0; s < part.numStages(); ++s) out.emplace_back(part.firstBlock(s), part.endBlock(s));
        return out;
      },
      pb::arg("d"), pb::arg("layers"), pb::arg("heads"), pb::arg("kv_heads"), pb::arg("ffn"), pb::arg("vocab"),
      pb::arg("pp"), "train_gpt's split of a Llama's blocks over pp stages: [(first, end)] per stage");
}

}  // namespace tessera::py
