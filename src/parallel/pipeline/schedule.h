#pragma once
// Pipeline schedules as data: for every pp rank, the ordered list of actions it performs in
// one training step — Forward/Backward of (micro-batch, chunk) and Comm batches (sends and
// receives issued together as one batchP2P, completing together). Pure functions: no device,
// no communication; the executor (executor.h) walks a table, tests simulate all ranks' tables.
//
// Stages: with `chunks` virtual stages per rank (interleaved), rank r's chunk c is virtual
// stage c·pp + r (Megatron's assignment); stage 0 takes the micro-batch input, stage
// pp·chunks − 1 computes the loss. Activations flow r → (r+1) % pp, gradients back.
//
// Schedules (M micro-batches, P = pp):
// - GPipe: all M forwards, then all M backwards (in micro-batch order). Any M >= 1.
// - 1F1B: warm-up of min(P − r − 1, M) forwards, then one-forward-one-backward, then the
//   remaining backwards. Needs M >= P (fewer is an error: the pipeline would never fill).
//   At most P − r micro-batches are in flight on rank r.
//   With `extraWarmup` = k > 0, every rank but the last warms up with k more forwards
//   (min(P − r − 1 + k, M)); at most P − r + k micro-batches are then in flight there. This
//   is for unbalanced stages: a slower stage keeps computing forwards while the faster stages
//   after it return the first gradients, instead of waiting for them (pipeline/simulate.h
//   estimates the effect). The last stage's warm-up stays 0: its backward never waits.
// - Interleaved 1F1B (Megatron's ordering): chunks >= 2, pp >= 2, M % pp == 0; warm-up of
//   (P − r − 1)·2 + (chunks − 1)·P forwards (all of them when M == P).
// - ZB-H1 (zero bubble, Qi et al. 2023, "handcrafted 1"): backward is split into B, the input
//   gradient (what the previous stage waits for), and W, the weight gradient (what nobody
//   waits for). Rank r runs 1F1B's order with B in place of the backward, and W of micro-batch
//   m right after B of micro-batch m + r (the remaining W's at the end): postponed W's fill
//   the cool-down where 1F1B idles. With forward, B and W of one cost each the step takes
//   3M + (P − 1) units against 1F1B's 3M + 3(P − 1) (test_schedule checks it). A micro-batch
//   is in flight from its F to its W: at most min(P, M) on every rank (1F1B's rank 0 peak).
//   Needs M >= pp and one chunk.
// Communication placement: the compute orders above are played in lock-step ticks (each
// rank runs its next computation once its input or output gradient has arrived in an
// earlier tick); after each tick a rank issues one batch with the sends of what it just
// computed and the receives of what its neighbours just computed. A batch thus pairs only
// with its neighbours' batches of the same tick, so the tables cannot deadlock, and 1F1B's
// fused send-forward-recv-backward / send-backward-recv-forward pairs fall out of it.
// Between two ranks, the k-th send a→b is matched with the k-th receive b←a.
#include <string>
#include <vector>

namespace tessera::pipeline {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved1F1B, ZeroBubbleH1 };
const char* toString(ScheduleKind k);  // "GPipe", "1F1B", "interleaved 1F1B", "ZB-H1" (for people)
// The command line's spellings: "gpipe" | "1f1b" | "interleaved" | "zb-h1"; anything else is an error.
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
  // True when backward is split into B and W actions (ZB-H1).
  bool splitsBackward() const { return kind == ScheduleKind::ZeroBubbleH1; }
  int stageOf(int rank, int chunk) const { return chunk * pp + rank; }
  bool isFirstStage(int rank, int chunk) const { return stageOf(rank, chunk) == 0; }
  bool isLastStage(int rank, int chunk) const { return stageOf(rank, chunk) == numStages() - 1; }
  // Max over the table of (forwards done − backwards done) on `rank`, in (micro, chunk) units;
  // when the schedule splits backward, a micro-batch is done at its W.
  int peakInFlight(int rank) const;
  // One line per action, e.g. "F m0 c0", "W m0 c0", "comm [send-fwd m0 c0 -> 1, recv-bwd m0 c0 <- 1]".
  std::string describe(int rank) const;
};

// Throws tessera::Error naming the numbers when the combination is invalid (pp < 1, M < 1,
// 1F1B or ZB-H1 with M < pp, interleaved with M % pp != 0, chunks < 2 or pp < 2, chunks != 1
// for GPipe/1F1B/ZB-H1, extraWarmup < 0 or given to a schedule other than 1F1B).
Schedule makeSchedule(ScheduleKind kind, int pp, int numMicro, int chunks = 1, int extraWarmup = 0);

// The 1F1B bound of in-flight micro-batches on `rank`: pp − rank, plus extraWarmup on every
// rank but the last (M when M is smaller).
int oneFOneBBound(int pp, int rank, int numMicro, int extraWarmup = 0);

}  // namespace tessera::pipeline
