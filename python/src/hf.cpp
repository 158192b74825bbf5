// tessera._C.hf: src/hf's Llama mapping for the Python Llama (tessera/hf.py): the config of a
// Hugging Face directory, filling pieces from its safetensors (each rank reads only its slices,
// through the C++ memory-mapped reader), and the collective export of pieces to an HF directory.
// A piece is (tessera name, global shape, offset, local tensor), as in tessera._C.checkpoint.
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "hf/convert.h"
#include "hf/json_io.h"
#include "hf/llama.h"
#include "tessera/common/error.h"
#include "tessera/hf/safetensors.h"

namespace tessera::py {
namespace {

models::ModelConfig configOf(const pb::dict& d) {
  models::ModelConfig c = models::presetConfig("llama-tiny");
  c.d = d["d"].cast<int64_t>();
  c.layers = d["layers"].cast<int64_t>();
  c.heads = d["heads"].cast<int64_t>();
  c.kvHeads = d["kv_heads"].cast<int64_t>();
  c.ffn = d["ffn"].cast<int64_t>();
  c.vocab = d["vocab"].cast<int64_t>();
  c.seqLen = d["seq_len"].cast<int64_t>();
  c.ropeTheta = d["rope_theta"].cast<double>();
  c.tiedEmbeddings = d["tied"].cast<bool>();
  c.normEps = d["norm_eps"].cast<double>();
  c.ropeScaling = {};
  if (!d["rope_scaling"].is_none()) {
    const auto s = d["rope_scaling"].cast<pb::dict>();
    c.ropeScaling = {true, s["factor"].cast<double>(), s["low"].cast<double>(), s["high"].cast<double>(),
                     s["original"].cast<int64_t>()};
  }
  models::validate(c);
  return c;
}

// The Python Llama (tessera/llama.py) is the plain Llama: a directory of another family (q/k norms,
// an explicit head size, experts) is refused, not loaded without its norms or experts.
models::ModelConfig plainLlama(const std::string& dir) {
  const auto c = hf::readLlamaConfig(dir);
  TESSERA_CHECK(c.qkNorm == models::QkNorm::None && c.headSize == 0 && c.moe.experts == 0,
                "tessera.hf: {} is {}: the Python Llama has no q/k norm, explicit head size or experts (train_gpt "
                "and tessera-convert take it)",
                dir, c.describe());
  return c;
}

}  // namespace

void bindHf(pb::module_& m) {
  auto h = m.def_submodule("hf", "src/hf's Hugging Face Llama mapping (see tessera.hf)");
  h.def(
      "llama_config", [](const std::string& dir) { return configDict(plainLlama(dir)); }, pb::arg("hf_dir"),
      "The tessera Llama config of an HF directory's config.json (refusals name the field)");
  h.def(
      "fill_llama",
      [](const std::string& dir, const std::vector<PieceArg>& pieces) {
        auto ps = toPieces(pieces);
        pb::gil_scoped_release nogil;
        const hf::SafetensorsCheckpoint ck(dir);
        const auto c = plainLlama(dir);
        hf::checkLlamaTensors(ck, c);
        hf::fillLlamaPieces(ck, c, ps);
      },
      pb::arg("hf_dir"), pb::arg("pieces"),
      "Local: fills each (tessera name, global shape, offset, tensor) in place from the HF tensors' slices");
  h.def(
      "export_llama",
      [](Communicator& world, const pb::dict& cfg, const std::vector<PieceArg>& pieces, const std::string& dir,
         const std::string& dtype, const std::string& baseConfig, const std::string& source) {
        const auto c = configOf(cfg);
        std::map<std::string, std::vector<checkpoint::Piece>> byName;
        for (auto& p : toPieces(pieces)) byName[p.name].push_back(p);
        std::optional<hf::ConfigJson> base;
        if (!baseConfig.empty()) {
          base = hf::ConfigJson(hf::parseJson(baseConfig.data(), baseConfig.size(), "base config"), "base config");
        }
        hf::ConvertOptions o;
        o.dtype = dtype;
        pb::gil_scoped_release nogil;
        hf::exportLlamaLive(world, c, base, source,
                            [&](const std::string& n) {
                              auto it = byName.find(n);
                              return it == byName.end() ? std::vector<checkpoint::Piece>{} : it->second;
                            },
                            dir, o);
      },
      pb::arg("world"), pb::arg("config"), pb::arg("pieces"), pb::arg("hf_dir"), pb::arg("dtype"),
      pb::arg("base_config") = "", pb::arg("source") = "",
      "Collective over world: the pieces gathered to rank 0 a tensor at a time and written as an HF directory");
}

}  // namespace tessera::py
