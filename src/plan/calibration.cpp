// A card's calibration: lookups and JSON (contract in plan/calibration.h).
#include "tessera/plan/calibration.h"

#include <algorithm>
#include <cmath>
#include <fmt/ranges.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessera/common/error.h"

namespace tessera::plan {

using Json = nlohmann::json;

double Link::busbw(const std::string& op, double bytes, int ranks) const {
  double scale = 1;
  for (const auto& [k, v] : rankScale) {
    if (k <= ranks) scale = v;
  }
  return scale * busbwAt(op, bytes);
}

double Link::busbwAt(const std::string& op, double bytes) const {
  auto it = busGBs.find(op);
  if (it == busGBs.end()) it = busGBs.find("all_gather");
  TESSERA_CHECK(it != busGBs.end() && !it->second.empty(), "link '{}': no bus bandwidth for {}", name, op);
  const auto& s = it->second;
  if (bytes <= s.front().first) return s.front().second;
  if (bytes >= s.back().first) return s.back().second;
  for (size_t i = 1; i < s.size(); ++i) {
    if (bytes <= s[i].first) {
      const double a = std::log(s[i - 1].first), b = std::log(s[i].first), x = std::log(bytes);
      return s[i - 1].second + (s[i].second - s[i - 1].second) * (x - a) / (b - a);
    }
  }
  return s.back().second;
}

double Calibration::gemmMs(const std::string& op, int64_t m, int64_t n, int64_t k, bool fp8) const {
  const GemmSample* best = nullptr;
  double bestDist = std::numeric_limits<double>::infinity();
  for (const auto& g : gemms) {
    if (g.op != op || g.fp8 != fp8) continue;
    const double dist =
        std::abs(std::log(double(g.m) / m)) + std::abs(std::log(double(g.n) / n)) + std::abs(std::log(double(g.k) / k));
    if (dist < bestDist) bestDist = dist, best = &g;
  }
  TESSERA_CHECK(best != nullptr, "calibration of {}: no {} {} GEMM measured", card, fp8 ? "FP8" : "bf16", op);
  return best->ms * (double(m) * n * k / (double(best->m) * best->n * best->k));
}

std::pair<double, double> Calibration::attentionMs(int64_t batch, int64_t heads, int64_t kvHeads, int64_t seq,
                                                   int64_t headDim, int cp) const {
  // Context parallel: samples of this cp where there are any (one rank's time), else those of a group of
  // one (1/cp of their work per rank: the chunks are balanced), else plain causal attention's.
  const bool ofCp = cp > 1 && std::any_of(cpAttention.begin(), cpAttention.end(), [&](auto& a) { return a.cp == cp; });
  const int want = ofCp ? cp : 1;
  const auto& samples = cp > 1 && !cpAttention.empty() ? cpAttention : attention;
  const double share = ofCp ? 1.0 : 1.0 / cp;
  const AttentionSample* best = nullptr;
  double bestDist = std::numeric_limits<double>::infinity();
  for (const auto& a : samples) {
    if (cp > 1 && !cpAttention.empty() && a.cp != want) continue;
    const double dist = std::abs(std::log(double(a.heads) / heads)) + std::abs(std::log(double(a.seq) / seq)) +
                        std::abs(std::log(double(a.headDim) / headDim)) +
                        0.25 * std::abs(std::log(double(a.kvHeads) / kvHeads));
    if (dist < bestDist) bestDist = dist, best = &a;
  }
  TESSERA_CHECK(best != nullptr, "calibration of {}: no attention measured", card);
  const double work = double(batch) * heads * seq * seq * headDim;
  const double ratio = share * work / (double(best->batch) * best->heads * best->seq * best->seq * best->headDim);
  return {best->forwardMs * ratio, best->backwardMs * ratio};
}

double Calibration::elementMs(const std::string& kind, double elements) const {
  auto it = elementNs.find(kind);
  TESSERA_CHECK(it != elementNs.end(), "calibration of {}: no '{}' kernel measured", card, kind);
  return it->second * elements * 1e-6;
}

namespace {

Json linkJson(const Link& l) {
  Json busbw = Json::object();
  for (const auto& [op, s] : l.busGBs) {
    Json pts = Json::array();
    for (const auto& [b, g] : s) pts.push_back({b, g});
    busbw[op] = pts;
  }
  Json j = {{"name", l.name}, {"latency_us", l.latencyUs}, {"busbw", busbw}};
  if (!l.rankScale.empty()) {
    Json scale = Json::object();
    for (const auto& [k, v] : l.rankScale) scale[std::to_string(k)] = v;
    j["busbw_scale"] = scale;
    j["scale_source"] = l.scaleSource;
  }
  return j;
}

template <class T>
T field(const Json& j, const char* key, const std::string& what) {
  TESSERA_CHECK(j.contains(key), "{}: missing field '{}'", what, key);
  try {
    return j.at(key).get<T>();
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: field '{}' has the wrong type ({})", what, key, e.what()));
  }
}

}  // namespace

Link linkFromJsonValue(const Json& j, const std::string& what) {
  Link l;
  l.name = j.value("name", std::string("link"));
  l.latencyUs = field<double>(j, "latency_us", what);
  if (j.contains("busbw_scale")) {
    for (const auto& [k, v] : j.at("busbw_scale").items()) l.rankScale[std::stoi(k)] = v.get<double>();
    l.scaleSource = j.value("scale_source", std::string());
  }
  if (j.contains("busbw_gbs")) {
    const double g = field<double>(j, "busbw_gbs", what);
    for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}) l.busGBs[op] = {{1.0, g}};
    return l;
  }
  const Json busbw = field<Json>(j, "busbw", what);
  for (const auto& [op, pts] : busbw.items()) {
    auto& s = l.busGBs[op];
    for (const auto& p : pts) s.emplace_back(p.at(0).get<double>(), p.at(1).get<double>());
    std::sort(s.begin(), s.end());
    TESSERA_CHECK(!s.empty(), "{}: link '{}' has no samples for {}", what, l.name, op);
  }
  return l;
}

namespace {
Json attentionJson(const std::vector<AttentionSample>& v) {
  Json a = Json::array();
  for (const auto& s : v) {
    Json e = {s.batch, s.heads, s.kvHeads, s.seq, s.headDim, s.forwardMs, s.backwardMs};
    if (s.cp != 1) e.push_back(s.cp);  // context parallel's group size; absent: 1
    a.push_back(e);
  }
  return a;
}

std::vector<AttentionSample> attentionFromJson(const Json& v) {
  std::vector<AttentionSample> out;
  for (const auto& s : v) {
    out.push_back({s.at(0).get<int64_t>(), s.at(1).get<int64_t>(), s.at(2).get<int64_t>(), s.at(3).get<int64_t>(),
                   s.at(4).get<int64_t>(), s.at(5).get<double>(), s.at(6).get<double>(),
                   s.size() > 7 ? s.at(7).get<int>() : 1});
  }
  return out;
}
}  // namespace

std::string calibrationToJson(const Calibration& c) {
  Json g = Json::array();
  for (const auto& s : c.gemms) g.push_back({s.op, s.m, s.n, s.k, s.fp8 ? "fp8" : "bf16", s.ms});
  Json j = {{"card", c.card},
            {"date", c.date},
            {"source", c.source},
            {"memory_gib", c.memoryGiB},
            {"peak_tflops_bf16", c.peakTflopsBf16},
            {"peak_tflops_fp8", c.peakTflopsFp8},
            {"gemm", g},
            {"attention", attentionJson(c.attention)},
            {"cp_attention", attentionJson(c.cpAttention)},
            {"element_ns", c.elementNs},
            {"adamw_ns_per_param", c.adamwNsPerParam},
            {"overlap_slowdown", c.overlapSlowdown},
            {"overlap_source", c.overlapSource},
            {"intra_node", linkJson(c.intraNode)}};
  return j.dump(1);
}

Calibration calibrationFromJsonValue(const Json& j, const std::string& what) {
  Calibration c;
  c.card = field<std::string>(j, "card", what);
  const std::string w = what + " (" + c.card + ")";
  c.date = j.value("date", std::string());
  c.source = j.value("source", std::string());
  c.memoryGiB = field<double>(j, "memory_gib", w);
  c.peakTflopsBf16 = field<double>(j, "peak_tflops_bf16", w);
  c.peakTflopsFp8 = field<double>(j, "peak_tflops_fp8", w);
  const Json gemms = field<Json>(j, "gemm", w), attention = field<Json>(j, "attention", w);
  for (const auto& s : gemms) {
    c.gemms.push_back({s.at(0).get<std::string>(), s.at(1).get<int64_t>(), s.at(2).get<int64_t>(),
                       s.at(3).get<int64_t>(), s.at(4).get<std::string>() == "fp8", s.at(5).get<double>()});
  }
  c.attention = attentionFromJson(attention);
  if (j.contains("cp_attention")) c.cpAttention = attentionFromJson(j.at("cp_attention"));
  c.elementNs = field<std::map<std::string, double>>(j, "element_ns", w);
  c.adamwNsPerParam = field<double>(j, "adamw_ns_per_param", w);
  c.overlapSlowdown = j.value("overlap_slowdown", 0.1);
  c.overlapSource = j.value("overlap_source", std::string());
  if (j.contains("intra_node")) c.intraNode = linkFromJsonValue(j.at("intra_node"), w + " intra_node");
  return c;
}

Calibration calibrationFromJson(const std::string& json, const std::string& what) {
  Json j;
  try {
    j = Json::parse(json);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: not JSON ({})", what, e.what()));
  }
  return calibrationFromJsonValue(j, what);
}

namespace {
Json readFile(const std::string& path) {
  std::ifstream f(path);
  TESSERA_CHECK(f.good(), "calibration file {}: cannot be read", path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return Json::parse(ss.str());
  } catch (const std::exception& e) {
    throw Error(fmt::format("calibration file {}: not JSON ({})", path, e.what()));
  }
}
}  // namespace

Calibration loadCalibration(const std::string& path, const std::string& card) {
  const Json j = readFile(path);
  const Json list = field<Json>(j, "calibrations", "calibration file " + path);
  std::vector<std::string> cards;
  for (const auto& e : list) cards.push_back(e.value("card", std::string("?")));
  for (const auto& e : list) {
    if ((card.empty() && list.size() == 1) || e.value("card", std::string()) == card) {
      return calibrationFromJsonValue(e, "calibration file " + path);
    }
  }
  throw Error(fmt::format("calibration file {}: no entry for card '{}' (it has: {})", path,
                          card.empty() ? "(any: give one)" : card, fmt::join(cards, ", ")));
}

void saveCalibration(const std::string& path, const Calibration& c) {
  Json j = {{"calibrations", Json::array()}};
  if (std::ifstream(path).good()) j = readFile(path);
  Json out = Json::array();
  for (const auto& e : j.at("calibrations")) {
    if (e.value("card", std::string()) != c.card) out.push_back(e);
  }
  out.push_back(Json::parse(calibrationToJson(c)));
  j["calibrations"] = out;
  std::ofstream f(path);
  TESSERA_CHECK(f.good(), "calibration file {}: cannot be written", path);
  f << j.dump(1) << "\n";
}

}  // namespace tessera::plan
