#pragma once
// What the planner is asked about: the work (a model, its sequence length, the global batch,
// precision and recompute), the cluster (GPU count, GPUs per node, memory, the links inside and
// between nodes) and a layout (the mesh's degrees, data-parallel sharding, micro-batching, the
// pipeline schedule). A layout is written as "dp=4,tp=2,pp=1,cp=1,fsdp,mb=1,m=8,1f1b" (parseLayout,
// describe; "keep": --fsdp-keep-gathered on, "shardacc": --fsdp-accumulate sharded). Local; pure data; parse errors →
// tessera::Error naming the token.
#include <cstdint>
#include <string>

#include "tessera/models/config.h"
#include "tessera/parallel/pipeline/schedule.h"
#include "tessera/plan/calibration.h"

namespace tessera::plan {

enum class Sharding { Ddp, Fsdp, Hsdp };  // HSDP: FSDP inside a node, replicas across nodes
enum class RecomputeMode { None, Selective, Full };
const char* toString(Sharding s);
const char* toString(RecomputeMode r);
RecomputeMode parseRecompute(const std::string& s);  // "none" | "selective" | "full"

struct Workload {
  models::ModelConfig model;
  int64_t seqLen = 2048;
  int64_t globalBatch = 8;  // sequences per optimizer step
  bool fp8 = false;         // tensorwise FP8 on the blocks' linears
  RecomputeMode recompute = RecomputeMode::None;
};

struct Layout {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  Sharding sharding = Sharding::Ddp;
  bool sp = true;            // sequence parallel with tp > 1
  int64_t microBatch = 1;    // sequences per micro-batch per data-parallel rank
  int64_t microBatches = 1;  // per optimizer step
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::OneFOneB;
  int chunks = 1;                    // virtual stages per pp rank (interleaved: ≥ 2; ZB-V: 2)
  bool keepGathered = false;         // FSDP units gathered once a step (--fsdp-keep-gathered)
  bool shardedAccumulation = false;  // FSDP reduce-scatters every micro-batch (--fsdp-accumulate sharded)

  int gpus() const { return dp * tp * pp * cp; }
};

struct Cluster {
  int gpus = 1, gpusPerNode = 8;
  double memoryGiB = 80;
  Link intra, inter;  // inside a node; between nodes (per GPU, nccl-tests' bus bandwidth)
};

std::string describe(const Layout& l);
Layout parseLayout(const std::string& s);
// A cluster from a JSON file {"gpus_per_node", "memory_gib", "intra": link, "inter": link} where a
// link is {"name", "latency_us", "busbw": {"all_reduce": [[bytes, GB/s], ...], ...}} or
// {"name", "latency_us", "busbw_gbs": N} (one figure for every op and size).
Cluster clusterFromJson(const std::string& json, const std::string& what);
Link linkFromJson(const std::string& json, const std::string& what);
// Between nodes when nothing better is known: 400 Gb/s InfiniBand per GPU (45 GB/s bus bandwidth
// for every op and size, 20 µs a call): an assumption, and named so.
Link assumedInterNodeLink();
// A model by name: a preset ("llama3-8b"), a Hugging Face config.json or a directory holding one,
// each optionally followed by ":layers=4,d=8192,heads=64,kv=8,ffn=28672,vocab=32000,tied=0".
models::ModelConfig modelFromSpec(const std::string& spec);

}  // namespace tessera::plan
