// tessera_generate's flags; see options.h.
#include "options.h"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <sstream>

#include "tessera/common/error.h"

namespace tessera::generate {

namespace {

template <typename T, typename Read>
T parseWhole(const std::string& flag, const std::string& v, const char* what, Read read) {
  try {
    size_t n = 0;
    const T x = read(v, &n);
    if (n == v.size() && !v.empty()) return x;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("tessera_generate: {} expects {}, got '{}'", flag, what, v));
}
int64_t toInt(const std::string& flag, const std::string& v) {
  return parseWhole<int64_t>(flag, v, "an integer", [](const std::string& s, size_t* n) { return std::stoll(s, n); });
}
double toDouble(const std::string& flag, const std::string& v) {
  return parseWhole<double>(flag, v, "a number", [](const std::string& s, size_t* n) { return std::stod(s, n); });
}
std::vector<int64_t> toIds(const std::string& v) {
  std::vector<int64_t> out;
  std::stringstream ss(v);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(toInt("--prompt-ids", item));
  TESSERA_CHECK(!out.empty(), "tessera_generate: --prompt-ids expects ids such as 1,2,3, got '{}'", v);
  return out;
}
bool isSwitch(const std::string& flag) { return flag == "--tie-embeddings" || flag == "--untie-embeddings"; }

}  // namespace

std::string usage() {
  return "usage: tessera_generate MODEL_DIR --prompt-ids 1,2,3 [--prompt-ids ...] [--max-new-tokens N]\n"
         "  [--temperature T] [--top-p P] [--seed S] [--eos-id ID] [--tp N] [--logits-out FILE.safetensors]\n"
         "  [--model PRESET [--d D] [--layers L] [--heads H] [--kv-heads K] [--ffn F] [--vocab V] [--seq-len T]\n"
         "   [--positions none|learned|rope] [--rope-theta X] [--tie-embeddings | --untie-embeddings]]\n"
         "MODEL_DIR: a tessera checkpoint (train_gpt --checkpoint-dir; any saved layout) or a Hugging Face\n"
         "directory. Prints one line 'ids: a,b,c' per prompt: its continuation (rank 0, stdout).\n"
         "--logits-out: each prompt's logits of every generated step, as tensor prompt.<k> [steps, vocab].\n"
         "Defaults: 32 new tokens, temperature 0 (greedy), top-p 1, seed 0 (prompt k samples with seed S + k),\n"
         "no EOS id, tp = the world size (pp 1). The model flags are for checkpoints without a model config\n"
         "(older tessera); else the checkpoint's own config is used.\n"
         "tools/tessera-generate is the front end that takes text (--prompt, --tokenizer).\n";
}

GenerateCli parseCli(int argc, char** argv) {
  GenerateCli o;
  std::multimap<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      o.help = true;
      return o;
    }
    if (a.rfind("--", 0) != 0) {
      TESSERA_CHECK(o.modelDir.empty(), "tessera_generate: unexpected argument '{}' (MODEL_DIR is '{}')\n{}", a,
                    o.modelDir, usage());
      o.modelDir = a;
      continue;
    }
    std::string name = a, value;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else if (!isSwitch(name)) {
      TESSERA_CHECK(i + 1 < argc, "tessera_generate: {} needs a value", name);
      value = argv[++i];
    }
    kv.emplace(name, value);
  }
  auto take = [&](const std::string& n, const std::function<void(const std::string&)>& f) {
    auto [lo, hi] = kv.equal_range(n);
    for (auto it = lo; it != hi; ++it) f(it->second);
    kv.erase(n);
  };
  TESSERA_CHECK(!o.modelDir.empty(), "tessera_generate: no MODEL_DIR given\n{}", usage());
  take("--prompt-ids", [&](const std::string& v) { o.prompts.push_back(toIds(v)); });
  TESSERA_CHECK(!o.prompts.empty(),
                "tessera_generate: no prompt: give --prompt-ids 1,2,3 (or use tools/tessera-generate --prompt TEXT "
                "--tokenizer MODEL)");
  auto& g = o.gen;
  take("--max-new-tokens", [&](const std::string& v) { g.maxNewTokens = toInt("--max-new-tokens", v); });
  take("--temperature", [&](const std::string& v) { g.sampling.temperature = toDouble("--temperature", v); });
  take("--top-p", [&](const std::string& v) { g.sampling.topP = toDouble("--top-p", v); });
  take("--seed", [&](const std::string& v) { g.sampling.seed = static_cast<uint64_t>(toInt("--seed", v)); });
  take("--eos-id", [&](const std::string& v) { g.eosId = toInt("--eos-id", v); });
  take("--tp", [&](const std::string& v) { o.tp = static_cast<int>(toInt("--tp", v)); });
  take("--logits-out", [&](const std::string& v) { o.logitsOut = v; });
  take("--model", [&](const std::string& v) { o.model = models::presetConfig(v); });
  auto shape = [&](const char* n, const std::function<void(models::ModelConfig&, const std::string&)>& f) {
    take(n, [&](const std::string& v) {
      TESSERA_CHECK(o.model, "tessera_generate: {} needs --model PRESET first (the shape flags change a preset)", n);
      f(*o.model, v);
    });
  };
  shape("--d", [](auto& c, const std::string& v) { c.d = toInt("--d", v); });
  shape("--layers", [](auto& c, const std::string& v) { c.layers = toInt("--layers", v); });
  shape("--heads", [](auto& c, const std::string& v) { c.heads = toInt("--heads", v); });
  shape("--kv-heads", [](auto& c, const std::string& v) { c.kvHeads = toInt("--kv-heads", v); });
  shape("--ffn", [](auto& c, const std::string& v) { c.ffn = toInt("--ffn", v); });
  shape("--vocab", [](auto& c, const std::string& v) { c.vocab = toInt("--vocab", v); });
  shape("--seq-len", [](auto& c, const std::string& v) { c.seqLen = toInt("--seq-len", v); });
  shape("--positions", [](auto& c, const std::string& v) { c.positions = models::parsePositions(v); });
  shape("--rope-theta", [](auto& c, const std::string& v) { c.ropeTheta = toDouble("--rope-theta", v); });
  shape("--tie-embeddings", [](auto& c, const std::string&) { c.tiedEmbeddings = true; });
  shape("--untie-embeddings", [](auto& c, const std::string&) { c.tiedEmbeddings = false; });
  TESSERA_CHECK(kv.empty(), "tessera_generate: unknown flag '{}'\n{}", kv.begin()->first, usage());
  if (o.model) models::validate(*o.model);
  models::validate(g.sampling);
  TESSERA_CHECK(g.maxNewTokens >= 1, "tessera_generate: --max-new-tokens must be >= 1, got {}", g.maxNewTokens);
  TESSERA_CHECK(o.tp >= 0, "tessera_generate: --tp must be >= 1, got {}", o.tp);
  return o;
}

}  // namespace tessera::generate
