// Peak memory of a layout's fullest rank (contract in plan/predict.h).
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "plan/costs.h"
#include "plan/stages.h"

namespace tessera::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// bf16 bytes one micro-batch leaves saved for backward in one block on one rank.
double blockActivationBytes(const Workload& w, const Layout& l) {
  const auto& m = w.model;
  const double t = static_cast<double>(tokensPerMicro(w, l)), tp = l.tp;
  const double tElem = l.sp && l.tp > 1 ? t / tp : t;
  const double hd = static_cast<double>(m.headDim());
  const double q = m.heads * hd / tp, kv = m.kvH() * hd / tp, f = m.ffnSize() / tp;
  const bool llama = m.arch == models::Arch::Llama;
  if (w.recompute == RecomputeMode::Full) return 2 * tElem * m.d;
  // inputs of the two norms (sequence-sharded), the gathered norm outputs the column GEMMs read,
  // q k v, the MLP's projection (Llama: gate and up); without recompute also attention's output
  // and the activation's.
  double elems = 2 * tElem * m.d + 2 * t * m.d + t * (q + 2 * kv) + t * (llama ? 2 : 1) * f;
  if (w.recompute == RecomputeMode::None) elems += t * q + t * f;
  return 2 * elems;
}

}  // namespace

std::shared_ptr<const ScheduleInfo> scheduleFor(const Layout& l) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int64_t, int>, std::shared_ptr<const ScheduleInfo>> cache;
  const auto key = std::make_tuple(static_cast<int>(l.schedule), l.pp, l.microBatches, l.chunks);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  auto info = std::make_shared<ScheduleInfo>();
  info->table = pipeline::makeSchedule(l.schedule, l.pp, static_cast<int>(l.microBatches), l.chunks);
  for (int r = 0; r < l.pp; ++r) info->peakInFlight.push_back(info->table.peakInFlight(r));
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() > 4096) cache.clear();
  return cache.emplace(key, info).first->second;
}

Prediction predictMemory(const Workload& w, const Layout& l, const Cluster& c) {
  requireCostable(w);
  const Stages st = stagesOf(w, l);
  const int64_t micro = l.microBatches;
  const double t = static_cast<double>(tokensPerMicro(w, l));
  Prediction best;
  std::shared_ptr<const ScheduleInfo> sched;
  if (l.pp > 1) sched = scheduleFor(l);
  for (int r = 0; r < l.pp; ++r) {
    double params = 0, act = 0, blocksMax = 0;
    bool last = false;
    for (int s : st.ofRank[r]) {
      params += stageParams(w, l, st.blocks(s), st.first(s), st.last(s));
      blocksMax = std::max<double>(blocksMax, st.blocks(s));
      last = last || st.last(s);
    }
    const double inFlight = l.pp > 1 ? sched->peakInFlight[r] : 1;
    act = inFlight * blocksMax * blockActivationBytes(w, l);
    // bf16 logits; their gradient is written over them (GPU runs' fused loss: vocab.h, gradInLogits).
    if (last) act += t * (w.model.vocab / static_cast<double>(l.tp)) * 2;
    Prediction p;
    const bool sharded = l.sharding != Sharding::Ddp && dataRanks(l) > 1;
    const int shard = shardGroup(l, c);
    const double own = sharded ? params / shard : params;
    p.optimizerStateGiB = own * (4 + 8) / kGiB;  // float32 master weights, AdamW's two moments
    double gathered = params * 2;                // bf16 weights (autocast's per-step cache, FSDP's gathered units)
    if (sharded && !l.keepGathered) gathered = std::min(gathered, 3.0 * params / std::max(1.0, blocksMax) * 2);
    double grads = own * 4;                                                   // float32 gradients (FSDP: the shard)
    if (sharded && micro > 1 && !l.shardedAccumulation) grads += params * 4;  // FSDP's local accumulation
    // FP8 codes and their transposes: every weight's for the step where they are cached (DDP, or FSDP
    // with units kept: parallel/tensor/fp8_weight_cache.h); else cast per unit as it runs, so the gathered
    // units' only.
    const double codes = params * 2;
    if (w.fp8) gathered += sharded && !l.keepGathered ? std::min(codes, 3.0 * codes / std::max(1.0, blocksMax)) : codes;
    p.paramsGiB = (gathered + grads) / kGiB;
    p.activationsGiB = act / kGiB;
    p.buffersGiB = 1.0;  // cuBLAS workspaces, NCCL buffers, the allocator's slack
    p.memoryGiB = p.optimizerStateGiB + p.paramsGiB + p.activationsGiB + p.buffersGiB;
    if (p.memoryGiB > best.memoryGiB) best = p;
  }
  return best;
}

}  // namespace tessera::plan
