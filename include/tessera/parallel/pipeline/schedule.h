#pragma once
// Pipeline schedules as data: for every pp rank, the ordered actions of one training step:
// Forward, Backward (or B and W, when split) of a (micro-batch, chunk), and Comm batches (sends and
// receives issued together as one batchP2P). Pure functions, local: no device, no communication.
// Rank r's chunk c is virtual stage c·pp + r (ZB-V: r and 2·pp − 1 − r, a V); stage 0 takes the
// input, stage pp·chunks − 1 computes the loss. The k-th send a→b matches the k-th receive b←a.
// Schedules (M micro-batches, P = pp; in flight: micro-batches between F and B, or W when split):
// - GPipe: every forward, then every backward. Any M >= 1.
// - 1F1B: min(P − r − 1 + k, M) warm-up forwards (k = extraWarmup, 0 on the last rank), then one
//   forward one backward. M >= P; at most P − r + k in flight on rank r.
// - Interleaved 1F1B (Megatron's order): chunks >= 2, pp >= 2, M % pp == 0.
// - ZB-H1: backward split into B and W (weight gradients, later). M >= pp, one chunk; min(P, M) in flight.
// - ZB-V: two chunks in a V, B and W split, a greedy zero-bubble order of at most 2·P chunk
//   activations per rank (1F1B's memory). pp >= 2, M >= pp.
// Why, and how the ticks place communication: docs/design/pipeline.md.
#include <string>
#include <vector>

namespace tessera::pipeline {

// Virtual stage of a rank's chunk: chunk·pp + rank, or in a V (vShape: two chunks) rank for chunk 0
// and 2·pp − 1 − rank for chunk 1.
inline int stageOfRank(int pp, int rank, int chunk, bool vShape) {
  return vShape && chunk == 1 ? 2 * pp - 1 - rank : chunk * pp + rank;
}

enum class ScheduleKind { GPipe, OneFOneB, Interleaved1F1B, ZeroBubbleH1, ZeroBubbleV };
const char* toString(ScheduleKind k);  // "GPipe", "1F1B", "interleaved 1F1B", "ZB-H1", "ZB-V" (for people)
// The command line's spellings: "gpipe" | "1f1b" | "interleaved" | "zb-h1" | "zbv"; anything else is an error.
ScheduleKind parseScheduleKind(const std::string& s);
const char* scheduleName(ScheduleKind k);

// `chunk` is always this rank's local chunk: SendForward: the chunk whose output is sent;
// RecvForward: the chunk that takes it as input; RecvBackward: the chunk whose output's
// gradient arrives; SendBackward: the chunk whose input gradient is sent.
enum class CommKind { SendForward, RecvForward, SendBackward, RecvBackward };
const char* toString(CommKind k);
bool isSend(CommKind k);

struct CommAction {
  CommKind kind;
  int micro = 0;
  int chunk = 0;
  int peer = 0;  // rank in the pp group
};

// Backward: the whole backward, or only the input gradient (B) when the schedule splits it;
// WeightGrad (W): the weight gradients that B deferred (nn/deferred_grads.h).
struct Action {
  enum Kind { Forward, Backward, WeightGrad, Comm } kind = Forward;
  int micro = -1;                // Forward / Backward / WeightGrad
  int chunk = 0;                 // Forward / Backward / WeightGrad
  std::vector<CommAction> comm;  // Comm: one batch
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int pp = 1, numMicro = 1, chunks = 1;
  int extraWarmup = 0;  // 1F1B only (see above)
  std::vector<std::vector<Action>> ranks;  // ranks[r][tick]

  int numStages() const { return pp * chunks; }
  // True when backward is split into B and W actions (ZB-H1, ZB-V).
  bool splitsBackward() const { return kind == ScheduleKind::ZeroBubbleH1 || kind == ScheduleKind::ZeroBubbleV; }
  bool vShape() const { return kind == ScheduleKind::ZeroBubbleV; }
  int stageOf(int rank, int chunk) const { return stageOfRank(pp, rank, chunk, vShape()); }
  int rankOfStage(int stage) const { return vShape() && stage >= pp ? 2 * pp - 1 - stage : stage % pp; }
  int chunkOfStage(int stage) const { return stage / pp; }
  bool isFirstStage(int rank, int chunk) const { return stageOf(rank, chunk) == 0; }
  bool isLastStage(int rank, int chunk) const { return stageOf(rank, chunk) == numStages() - 1; }
  int lastStageRank() const { return rankOfStage(numStages() - 1); }  // pp − 1; ZB-V: 0
  // This rank's chunk that holds the stage before (after) chunk c's when that stage is on this rank
  // too (ZB-V's turn at rank pp − 1), else −1: its output is handed over without communication.
  int localPrevChunk(int rank, int chunk) const;
  int localNextChunk(int rank, int chunk) const;
  // Max over the table of (forwards done − backwards done) on `rank`, in (micro, chunk) units;
  // when the schedule splits backward, a micro-batch is done at its W.
  int peakInFlight(int rank) const;
  // One line per action, e.g. "F m0 c0", "W m0 c0", "comm [send-fwd m0 c0 -> 1, recv-bwd m0 c0 <- 1]".
  std::string describe(int rank) const;
};

// Example:
//   const tessera::pipeline::Schedule s =
//       tessera::pipeline::makeSchedule(tessera::pipeline::ScheduleKind::ZeroBubbleH1, /*pp=*/4, /*numMicro=*/8);
//   for (int r = 0; r < s.pp; ++r)  // rank r's actions ("F m0 c0", "comm [send-fwd m0 c0 -> 1]", ...)
//     tessera::log::info("rank {}: at most {} in flight\n{}", r, s.peakInFlight(r), s.describe(r));

// Throws tessera::Error naming the numbers when the combination is invalid (pp < 1, M < 1,
// 1F1B, ZB-H1 or ZB-V with M < pp, interleaved with M % pp != 0, chunks < 2 or pp < 2, chunks != 1
// for GPipe/1F1B/ZB-H1, ZB-V with chunks != 2 or pp < 2, extraWarmup < 0 or given to a schedule
// other than 1F1B).
Schedule makeSchedule(ScheduleKind kind, int pp, int numMicro, int chunks = 1, int extraWarmup = 0);

// The 1F1B bound of in-flight micro-batches on `rank`: pp − rank, plus extraWarmup on every
// rank but the last (M when M is smaller).
int oneFOneBBound(int pp, int rank, int numMicro, int extraWarmup = 0);

}  // namespace tessera::pipeline
