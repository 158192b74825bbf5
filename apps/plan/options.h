#pragma once
// tessera_plan's command line (apps/plan/tessera_plan.cpp): the subcommand and its options.
#include <string>
#include <vector>

#include "tessera/plan/search.h"

namespace tessera::planapp {

struct Options {
  std::string command;  // calibrate | search | predict | predict-many
  std::string requests;  // predict-many: a JSON list of {card, model, gpus, seq, batch, layout, recompute, fp8}
  // calibrate
  std::string out;
  std::vector<std::string> models = {"735m",
                                     "llama3-1b",
                                     "llama3-8b",
                                     "llama3-8b:d=8192,heads=64,kv=8,ffn=28672",
                                     "llama3-8b:d=16384,heads=128,kv=8,ffn=53248",
                                     "llama3-8b:d=8192,heads=64,kv=8,ffn=28672,vocab=32000"};
  std::vector<int> tp = {1, 2, 4, 8};
  std::vector<int64_t> tokens = {2048, 8192, 32768};
  std::vector<int64_t> seqs = {1024, 2048, 4096, 8192};
  std::string intraLink;
  bool noFp8 = false;
  // search | predict
  std::string model = "llama3-8b", calibration, card, cluster, layout, json;
  int gpus = 8, gpusPerNode = 8, top = 8, refused = 5, maxCp = 8;
  double memoryGiB = 0;        // 0: the calibration's card
  int64_t seq = 0, batch = 0;  // 0: the model's sequence length; the global batch must be given
  bool fp8 = false;
  std::vector<std::string> recompute = {"none", "selective", "full"};
  std::vector<int64_t> microBatchSizes = {1, 2, 4};
};

// Parses argv; --help prints the usage and exits 0; bad arguments print the error and exit 2.
Options parseOptions(int argc, char** argv);

}  // namespace tessera::planapp
