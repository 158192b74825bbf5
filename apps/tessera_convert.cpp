// tessera_convert: Hugging Face Llama directories <-> tessera checkpoints (src/hf/convert.h).
// One process, no communication; tools/tessera-convert is its front end.
//   tessera_convert import-hf HF_DIR CKPT_DIR
//   tessera_convert export-hf CKPT_DIR HF_DIR [--dtype bf16|fp32] [--max-shard-bytes N]
// import-hf writes a step-0, weights-only checkpoint that train_gpt --checkpoint-dir resumes in
// any layout (fresh optimizer, data from the start); export-hf writes config.json,
// generation_config.json and safetensors (sharded with an index past --max-shard-bytes, default
// 5 GB) that transformers' LlamaForCausalLM.from_pretrained loads, from a checkpoint of any layout.
// Exit status: 0 on success, 1 on an error, 2 on bad arguments.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tessera/common/error.h"
#include "hf/convert.h"

namespace {

constexpr const char* kUsage =
    "usage: tessera-convert import-hf HF_DIR CKPT_DIR\n"
    "       tessera-convert export-hf CKPT_DIR HF_DIR [--dtype bf16|fp32] [--max-shard-bytes N]\n"
    "import-hf: a Hugging Face Llama (config.json + safetensors) -> a tessera checkpoint at step 0\n"
    "           (weights only: train_gpt --checkpoint-dir CKPT_DIR fine-tunes it in any layout)\n"
    "export-hf: a tessera checkpoint of a Llama (any layout) -> config.json + safetensors (+ index)\n"
    "           for transformers (default bf16, its torch_dtype; files of at most 5 GB)\n";

int usageError(const std::string& what) {
  std::fprintf(stderr, "tessera-convert: %s\n%s", what.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  std::vector<std::string> pos;
  tessera::hf::ConvertOptions o;
  bool dtypeGiven = false;
  for (size_t i = 1; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a == "--dtype" || a == "--max-shard-bytes") {
      if (i + 1 >= args.size()) return usageError(a + " needs a value");
      const auto& v = args[++i];
      if (a == "--dtype") {
        if (v != "bf16" && v != "fp32") return usageError("--dtype expects bf16 or fp32, got '" + v + "'");
        o.dtype = v;
        dtypeGiven = true;
      } else {
        char* end = nullptr;
        const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n == 0) return usageError("--max-shard-bytes expects a positive integer");
        o.maxShardBytes = n;
      }
    } else if (a.rfind("--", 0) == 0) {
      return usageError("unknown option '" + a + "'");
    } else {
      pos.push_back(a);
    }
  }
  if (cmd != "import-hf" && cmd != "export-hf") return usageError("unknown command '" + cmd + "'");
  if (pos.size() != 2) return usageError(fmt::format("{} takes two directories, got {}", cmd, pos.size()));
  if (cmd == "import-hf" && (dtypeGiven || o.maxShardBytes != tessera::hf::ConvertOptions{}.maxShardBytes)) {
    return usageError("import-hf takes no --dtype or --max-shard-bytes (tessera checkpoints are float32)");
  }
  try {
    if (cmd == "import-hf") {
      tessera::hf::importLlama(pos[0], pos[1], o);
    } else {
      tessera::hf::exportLlama(pos[0], pos[1], o);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-convert: error: %s\n", e.what());
    return 1;
  }
  std::fflush(nullptr);
  std::_Exit(0);  // as train_gpt: without LibTorch's static destructors
}
