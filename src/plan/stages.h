#pragma once
// Internal: a layout's pipeline stages as the runtime partitions them (train/model_spec.cpp's
// options over parallel/pipeline/partition.h), and which stages each pp rank holds. Local; pure.
#include <memory>
#include <vector>

#include "tessera/parallel/pipeline/partition.h"
#include "tessera/plan/layout.h"

namespace tessera::plan {

struct Stages {
  pipeline::Partition part;
  std::vector<std::vector<int>> ofRank;  // ofRank[r]: virtual stages rank r holds
  int blocks(int s) const { return part.endBlock(s) - part.firstBlock(s); }
  bool first(int s) const { return s == 0; }
  bool last(int s) const { return s == part.numStages() - 1; }
};

// A schedule table and its ranks' peak in-flight counts, made once per (kind, pp, M, chunks) and
// shared (a search asks for the same tables thousands of times). makeSchedule's errors pass through.
struct ScheduleInfo {
  pipeline::Schedule table;
  std::vector<int> peakInFlight;
};
std::shared_ptr<const ScheduleInfo> scheduleFor(const Layout& l);

inline Stages stagesOf(const Workload& w, const Layout& l) {
  const auto& m = w.model;
  pipeline::PartitionOptions o;
  o.pp = l.pp;
  o.chunks = l.chunks;
  o.vShape = l.schedule == pipeline::ScheduleKind::ZeroBubbleV;
  o.embeddingParams = m.vocab * m.d;
  o.headParams = m.vocab * m.d + 2 * m.d;
  o.embeddingIsLookup = true;
  std::vector<int64_t> cost;
  for (int64_t b = 0; b < m.layers; ++b) cost.push_back(models::activeBlockParamCount(m, b));
  Stages s{pipeline::partitionBlocks(cost, o), std::vector<std::vector<int>>(l.pp)};
  for (int r = 0; r < l.pp; ++r) {
    for (int c = 0; c < l.chunks; ++c) s.ofRank[r].push_back(s.part.stageOf(r, c));
  }
  return s;
}

}  // namespace tessera::plan
