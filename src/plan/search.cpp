// Enumerating and ranking layouts (contract in plan/search.h).
#include "tessera/plan/search.h"

#include <algorithm>

#include "plan/costs.h"
#include "tessera/common/error.h"

namespace tessera::plan {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

struct Schedules {
  pipeline::ScheduleKind kind;
  int chunks;
};

std::vector<Schedules> schedulesFor(int pp) {
  using K = pipeline::ScheduleKind;
  if (pp == 1) return {{K::OneFOneB, 1}};
  return {
      {K::OneFOneB, 1}, {K::Interleaved1F1B, 2}, {K::Interleaved1F1B, 4}, {K::ZeroBubbleH1, 1}, {K::ZeroBubbleV, 2}};
}

// Every layout of the cluster's GPUs for one recompute mode and micro-batch size.
void layoutsFor(const Workload& w, const Cluster& c, int64_t mb, const SearchOptions& o, std::vector<Layout>& out) {
  for (int tp : divisors(c.gpus)) {
    for (int cp : divisors(c.gpus / tp)) {
      if (cp > o.maxCp) continue;
      for (int pp : divisors(c.gpus / (tp * cp))) {
        const int dp = c.gpus / (tp * cp * pp);
        if (w.globalBatch % (dp * mb) != 0) continue;
        const int64_t micro = w.globalBatch / (dp * mb);
        std::vector<Sharding> shardings = {Sharding::Ddp};
        if (dp * cp > 1) shardings.push_back(Sharding::Fsdp);
        if (o.allowHsdp && dp * cp > 1 && c.gpus > c.gpusPerNode) shardings.push_back(Sharding::Hsdp);
        for (Sharding sh : shardings) {
          for (const Schedules& s : schedulesFor(pp)) {
            for (int variant = 0; variant < 4; ++variant) {
              const bool keep = variant & 1, shardAcc = variant & 2;
              if ((keep || shardAcc) && (sh == Sharding::Ddp || micro == 1)) continue;
              Layout l;
              l.dp = dp, l.tp = tp, l.pp = pp, l.cp = cp, l.sharding = sh, l.microBatch = mb, l.microBatches = micro;
              l.schedule = s.kind, l.chunks = s.chunks, l.keepGathered = keep, l.shardedAccumulation = shardAcc;
              out.push_back(l);
            }
          }
        }
      }
    }
  }
}

}  // namespace

SearchResult search(const Workload& w, const Cluster& c, const Calibration& cal, const SearchOptions& o) {
  TESSERA_CHECK(c.gpus >= 1 && c.gpusPerNode >= 1, "plan: a cluster of {} GPUs, {} per node", c.gpus, c.gpusPerNode);
  requireCostable(w);
  SearchResult r;
  for (RecomputeMode rc : o.recompute) {
    Workload work = w;
    work.recompute = rc;
    for (int64_t mb : o.microBatchSizes) {
      std::vector<Layout> layouts;
      layoutsFor(work, c, mb, o, layouts);
      for (const Layout& l : layouts) {
        std::string why = refusal(work, l, c, cal);
        if (!why.empty()) {
          r.refused.push_back({work, l, why});
          continue;
        }
        r.ranked.push_back({work, l, predict(work, l, c, cal)});
      }
    }
  }
  std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const Planned& a, const Planned& b) {
    return a.prediction.tokensPerSPerGpu > b.prediction.tokensPerSPerGpu;
  });
  return r;
}

}  // namespace tessera::plan
