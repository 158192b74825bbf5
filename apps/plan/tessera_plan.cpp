// tessera_plan: measures a card (calibrate), ranks every layout of a model over a cluster
// (search) or predicts one (predict) from that card's costs (src/plan/). One process, no
// communication; tools/tessera-plan is its front end. Exit status: 0, 1 on an error, 2 on bad arguments.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <torch/cuda.h>

#include "plan/options.h"
#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "tessera/plan/measure.h"

namespace {

using namespace tessera;
using namespace tessera::plan;

std::string readText(const std::string& path) {
  std::ifstream f(path);
  TESSERA_CHECK(f.good(), "tessera-plan: cannot read {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int calibrate(const planapp::Options& o) {
  MeasureOptions m;
  for (const auto& s : o.models) m.models.push_back(modelFromSpec(s));
  m.tp = o.tp, m.tokens = o.tokens, m.seqs = o.seqs, m.fp8 = !o.noFp8;
  m.progress = [](const std::string& line) { fmt::print("tessera-plan calibrate: {}\n", line); };
  Calibration c = measureCalibration(m);
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  c.date = date;
  if (!o.intraLink.empty()) c.intraNode = linkFromJson(readText(o.intraLink), o.intraLink);
  saveCalibration(o.out, c);
  fmt::print("tessera-plan calibrate: {} GEMMs, {} attention shapes, {} kernels of {} written to {}\n", c.gemms.size(),
             c.attention.size(), c.elementNs.size(), c.card, o.out);
  return 0;
}

struct Setup {
  Workload work;
  Cluster cluster;
  Calibration cal;
};

Setup setup(const planapp::Options& o) {
  Setup s;
  // No --card: this machine's GPU where there is one, else the file's only entry.
  const bool gpu = torch::cuda::is_available();
  s.cal = loadCalibration(o.calibration, o.card.empty() && gpu ? deviceName(at::Device(at::kCUDA, 0)) : o.card);
  s.work.model = modelFromSpec(o.model);
  s.work.seqLen = o.seq > 0 ? o.seq : s.work.model.seqLen;
  s.work.globalBatch = o.batch;
  s.work.fp8 = o.fp8;
  s.work.recompute = parseRecompute(o.recompute.at(0));
  if (!o.cluster.empty()) {
    s.cluster = clusterFromJson(readText(o.cluster), o.cluster);
  } else {
    s.cluster.gpusPerNode = o.gpusPerNode;
    s.cluster.memoryGiB = s.cal.memoryGiB;
    s.cluster.intra = s.cal.intraNode;
    s.cluster.inter = assumedInterNodeLink();
  }
  s.cluster.gpus = o.gpus;
  if (o.memoryGiB > 0) s.cluster.memoryGiB = o.memoryGiB;
  return s;
}

nlohmann::json toJson(const Planned& p) {
  const Prediction& r = p.prediction;
  return {{"layout", describe(p.layout)},
          {"recompute", toString(p.work.recompute)},
          {"step_ms", r.stepMs},
          {"compute_ms", r.computeMs},
          {"exposed_comm_ms", r.exposedCommMs},
          {"bubble_ms", r.bubbleMs},
          {"optimizer_ms", r.optimizerMs},
          {"hidden_comm_ms", r.hiddenCommMs},
          {"tokens_per_s_per_gpu", r.tokensPerSPerGpu},
          {"mfu", r.mfu},
          {"memory_gib", r.memoryGiB}};
}

void printRow(int i, const Planned& p) {
  const Prediction& r = p.prediction;
  fmt::print("{:>3}  {:<58} {:<9} {:>9.1f} {:>9.0f} {:>5.3f} {:>7.1f}   {:>8.1f} {:>7.1f} {:>7.1f} {:>6.1f}\n", i,
             describe(p.layout), toString(p.work.recompute), r.stepMs, r.tokensPerSPerGpu, r.mfu, r.memoryGiB,
             r.computeMs, r.exposedCommMs, r.bubbleMs, r.optimizerMs);
}

void printHeader(const Setup& s) {
  fmt::print(
      "model: {}\nwork: seq {}, global batch {}, {}; cluster: {} GPUs, {} per node, {:.0f} GiB each; "
      "card costs: {} ({})\n",
      s.work.model.describe(), s.work.seqLen, s.work.globalBatch, s.work.fp8 ? "FP8 tensorwise" : "bf16",
      s.cluster.gpus, s.cluster.gpusPerNode, s.cluster.memoryGiB, s.cal.card, s.cal.date);
  fmt::print("  #  {:<58} {:<9} {:>9} {:>9} {:>5} {:>7}   {:>8} {:>7} {:>7} {:>6}\n", "layout", "recompute", "step ms",
             "tok/s/GPU", "MFU", "GiB", "compute", "comm", "bubble", "optim");
}

int searchCommand(const planapp::Options& o) {
  const Setup s = setup(o);
  SearchOptions so;
  so.recompute.clear();
  for (const auto& r : o.recompute) so.recompute.push_back(parseRecompute(r));
  so.microBatchSizes = o.microBatchSizes;
  so.maxCp = o.maxCp;
  const SearchResult r = search(s.work, s.cluster, s.cal, so);
  printHeader(s);
  for (int i = 0; i < o.top && i < static_cast<int>(r.ranked.size()); ++i) printRow(i + 1, r.ranked[i]);
  std::map<std::string, int> reasons;
  for (const auto& x : r.refused)
    reasons[std::regex_replace(x.reason, std::regex("(^|[ =(])[0-9][0-9.]*(?![A-Za-z])"), "$1N")]++;
  fmt::print("{} layouts predicted, {} refused:\n", r.ranked.size(), r.refused.size());
  for (const auto& [why, n] : reasons) fmt::print("  {:>5} × {}\n", n, why);
  for (int i = 0; i < o.refused && i < static_cast<int>(r.refused.size()); ++i) {
    fmt::print("  e.g. {} ({}): {}\n", describe(r.refused[i].layout), toString(r.refused[i].work.recompute),
               r.refused[i].reason);
  }
  if (!o.json.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& p : r.ranked) j.push_back(toJson(p));
    std::ofstream(o.json) << j.dump(1) << "\n";
  }
  return r.ranked.empty() ? 1 : 0;
}

int predictCommand(const planapp::Options& o) {
  const Setup s = setup(o);
  const Layout l = parseLayout(o.layout);
  Planned p{s.work, l, predict(s.work, l, s.cluster, s.cal)};
  printHeader(s);
  printRow(1, p);
  for (const auto& [what, ms] : p.prediction.parts) fmt::print("     {:<36} {:>9.2f} ms\n", what, ms);
  if (!o.json.empty()) std::ofstream(o.json) << toJson(p).dump(1) << "\n";
  return 0;
}

// One prediction per request, in order: its JSON, or {"error": why} (a refusal, a bad request).
int predictManyCommand(const planapp::Options& o) {
  const nlohmann::json requests = nlohmann::json::parse(readText(o.requests));
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : requests) {
    try {
      planapp::Options one = o;
      one.card = r.at("card").get<std::string>();
      one.model = r.at("model").get<std::string>();
      one.gpus = r.at("gpus").get<int>();
      one.seq = r.at("seq").get<int64_t>();
      one.batch = r.at("batch").get<int64_t>();
      one.fp8 = r.value("fp8", false);
      one.recompute = {r.value("recompute", std::string("none"))};
      const Setup s = setup(one);
      const Layout l = parseLayout(r.at("layout").get<std::string>());
      out.push_back(toJson(Planned{s.work, l, predict(s.work, l, s.cluster, s.cal)}));
    } catch (const std::exception& e) {
      out.push_back({{"error", e.what()}});
    }
  }
  std::ofstream(o.json) << out.dump(1) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto o = tessera::planapp::parseOptions(argc, argv);
  try {
    if (o.command == "calibrate") return calibrate(o);
    if (o.command == "search") return searchCommand(o);
    if (o.command == "predict-many") return predictManyCommand(o);
    return predictCommand(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-plan: %s\n", e.what());
    return 1;
  }
}
