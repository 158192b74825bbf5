// Layouts as text, clusters and links from JSON, models from a name (contract in plan/layout.h).
#include "tessera/plan/layout.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hf/llama.h"
#include "tessera/common/error.h"

namespace tessera::plan {

Link linkFromJsonValue(const nlohmann::json& j, const std::string& what);  // calibration.cpp

const char* toString(Sharding s) { return s == Sharding::Ddp ? "ddp" : s == Sharding::Fsdp ? "fsdp" : "hsdp"; }
const char* toString(RecomputeMode r) {
  return r == RecomputeMode::None ? "none" : r == RecomputeMode::Selective ? "selective" : "full";
}
RecomputeMode parseRecompute(const std::string& s) {
  if (s == "none") return RecomputeMode::None;
  if (s == "selective") return RecomputeMode::Selective;
  if (s == "full") return RecomputeMode::Full;
  throw Error(fmt::format("plan: recompute '{}' is not none, selective or full", s));
}

std::string describe(const Layout& l) {
  std::string s = fmt::format("dp={},tp={},pp={},cp={},{}", l.dp, l.tp, l.pp, l.cp, toString(l.sharding));
  if (l.tp > 1 && !l.sp) s += ",nosp";
  s += fmt::format(",mb={},m={}", l.microBatch, l.microBatches);
  if (l.pp > 1) s += std::string(",") + pipeline::scheduleName(l.schedule);
  if (l.chunks > 1 && l.schedule != pipeline::ScheduleKind::ZeroBubbleV) s += fmt::format(",vp={}", l.chunks);
  if (l.keepGathered) s += ",keep";
  if (l.shardedAccumulation) s += ",shardacc";
  return s;
}

Layout parseLayout(const std::string& text) {
  Layout l;
  std::stringstream ss(text);
  std::string tok;
  auto number = [&](const std::string& v) -> int64_t {
    try {
      size_t used = 0;
      const int64_t n = std::stoll(v, &used);
      if (used == v.size() && n >= 1) return n;
    } catch (const std::exception&) {
    }
    throw Error(fmt::format("layout '{}': '{}' is not a positive integer in '{}'", text, v, tok));
  };
  while (std::getline(ss, tok, ',')) {
    const auto eq = tok.find('=');
    const std::string k = tok.substr(0, eq), v = eq == std::string::npos ? "" : tok.substr(eq + 1);
    if (k == "dp")
      l.dp = static_cast<int>(number(v));
    else if (k == "tp")
      l.tp = static_cast<int>(number(v));
    else if (k == "pp")
      l.pp = static_cast<int>(number(v));
    else if (k == "cp")
      l.cp = static_cast<int>(number(v));
    else if (k == "mb")
      l.microBatch = number(v);
    else if (k == "m")
      l.microBatches = number(v);
    else if (k == "vp")
      l.chunks = static_cast<int>(number(v));
    else if (k == "ddp")
      l.sharding = Sharding::Ddp;
    else if (k == "fsdp")
      l.sharding = Sharding::Fsdp;
    else if (k == "hsdp")
      l.sharding = Sharding::Hsdp;
    else if (k == "nosp")
      l.sp = false;
    else if (k == "keep")
      l.keepGathered = true;
    else if (k == "shardacc")
      l.shardedAccumulation = true;
    else {
      try {
        l.schedule = pipeline::parseScheduleKind(k);
      } catch (const Error&) {
        throw Error(
            fmt::format("layout '{}': unknown token '{}' (dp= tp= pp= cp= mb= m= vp=, ddp | fsdp | hsdp, "
                        "nosp, keep, shardacc, gpipe | 1f1b | interleaved | zb-h1 | zbv)",
                        text, tok));
      }
      if (l.schedule == pipeline::ScheduleKind::ZeroBubbleV) l.chunks = 2;
    }
  }
  return l;
}

Link linkFromJson(const std::string& json, const std::string& what) {
  return linkFromJsonValue(nlohmann::json::parse(json), what);
}

Link assumedInterNodeLink() {
  Link l;
  l.name = "InfiniBand 400 Gb/s per GPU (assumed)";
  l.latencyUs = 20;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}) l.busGBs[op] = {{1.0, 45.0}};
  return l;
}

Cluster clusterFromJson(const std::string& json, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: not JSON ({})", what, e.what()));
  }
  for (const char* k : {"gpus_per_node", "memory_gib", "intra", "inter"}) {
    TESSERA_CHECK(j.contains(k), "{}: missing field '{}'", what, k);
  }
  Cluster c;
  c.gpusPerNode = j.at("gpus_per_node").get<int>();
  c.memoryGiB = j.at("memory_gib").get<double>();
  c.intra = linkFromJsonValue(j.at("intra"), what + " intra");
  c.inter = linkFromJsonValue(j.at("inter"), what + " inter");
  c.gpus = j.value("gpus", c.gpusPerNode);
  return c;
}

models::ModelConfig modelFromSpec(const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string base = spec.substr(0, colon);
  models::ModelConfig m;
  const bool file = base.find('/') != std::string::npos || base.find(".json") != std::string::npos;
  if (file) {
    const bool json = base.size() > 5 && base.substr(base.size() - 5) == ".json";
    m = json ? hf::llamaConfigFromHf(hf::ConfigJson::read(base)) : hf::readLlamaConfig(base);
  } else {
    m = models::presetConfig(base);
  }
  if (colon == std::string::npos) return m;
  std::stringstream ss(spec.substr(colon + 1));
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    const auto eq = tok.find('=');
    TESSERA_CHECK(eq != std::string::npos, "model '{}': override '{}' is not key=value", spec, tok);
    const std::string k = tok.substr(0, eq);
    int64_t v = 0;
    try {
      v = std::stoll(tok.substr(eq + 1));
    } catch (const std::exception&) {
      throw Error(fmt::format("model '{}': '{}' is not a number in '{}'", spec, tok.substr(eq + 1), tok));
    }
    if (k == "layers")
      m.layers = v;
    else if (k == "d")
      m.d = v;
    else if (k == "heads")
      m.heads = v;
    else if (k == "kv")
      m.kvHeads = v;
    else if (k == "ffn")
      m.ffn = v;
    else if (k == "vocab")
      m.vocab = v;
    else if (k == "tied")
      m.tiedEmbeddings = v != 0;
    else
      throw Error(fmt::format("model '{}': unknown override '{}' (layers d heads kv ffn vocab tied)", spec, k));
  }
  models::validate(m);
  return m;
}

}  // namespace tessera::plan
