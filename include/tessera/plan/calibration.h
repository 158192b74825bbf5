#pragma once
// What one kind of GPU was measured to do, as the layout planner (plan/predict.h) reads it: GEMM
// times at given shapes (bf16 and FP8), fused attention's forward and backward, the elementwise
// kernels' cost per element, AdamW's per parameter, and the collectives' bus bandwidth by size over
// the links the card was measured on. Made by measureCalibration (plan/measure.h) on the local GPU,
// kept as JSON (bench/plan/calibration.json holds one entry per card). Lookups between measured
// shapes take the nearest sample and scale it by FLOPs (GEMMs) or work (attention), never
// extrapolating an efficiency above the best one measured. Local; pure data and pure functions.
// Errors: a malformed file or a missing field → tessera::Error naming the file and the field.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::plan {

// C[m, n] = A[m, k] · B[k, n] in `fp8` (tensorwise e4m3 operands) or bf16, as a linear's pass runs
// it: "fwd" (x · Wᵀ, bf16 out), "dgrad" (dy · W, bf16 out), "wgrad" (dyᵀ · x summed into float32).
struct GemmSample {
  std::string op = "fwd";
  int64_t m = 0, n = 0, k = 0;
  bool fp8 = false;
  double ms = 0;
};

// Causal attention over [batch, heads, seq, headDim] queries with kvHeads keys/values.
struct AttentionSample {
  int64_t batch = 1, heads = 1, kvHeads = 1, seq = 1, headDim = 1;
  double forwardMs = 0, backwardMs = 0;
  int cp = 1;  // context parallel's samples: the group size (seq is the whole sequence; one rank's time)
};

// A link's collectives: bus bandwidth (GB/s, nccl-tests' convention) by message bytes per op
// ("all_reduce", "all_gather", "reduce_scatter", "send_recv"), and a fixed latency per call.
struct Link {
  std::string name;
  double latencyUs = 10;
  std::map<std::string, std::vector<std::pair<double, double>>> busGBs;  // op → (bytes, GB/s), sorted
  // Groups of at least k ranks run at rankScale[k] of busGBs (the largest k ≤ the group's size; 1
  // below every k): busGBs is often measured on 2 GPUs, larger rings run slower.
  std::map<int, double> rankScale;
  std::string scaleSource;  // where rankScale comes from
  // Bus bandwidth of `op` at `bytes` over `ranks`, interpolated in log(bytes); the nearest end
  // outside the samples.
  double busbw(const std::string& op, double bytes, int ranks = 2) const;
  double busbwAt(const std::string& op, double bytes) const;  // unscaled
};

struct Calibration {
  std::string card, date, source;
  double memoryGiB = 0;
  double peakTflopsBf16 = 989, peakTflopsFp8 = 1979;  // dense, the MFU denominator
  std::vector<GemmSample> gemms;
  std::vector<AttentionSample> attention;
  // Context parallel's attention (parallel/context/attention.h: two query chunks against the keys,
  // its own kernel): one rank's time in a group of `cp` ranks, or over a group of one (cp 1, taken
  // as 1/cp of the work where no sample has the layout's cp); empty: the causal samples stand in.
  std::vector<AttentionSample> cpAttention;
  // ns per element, forward and backward together: "norm" (RMSNorm over d), "layernorm", "swiglu"
  // (per input element of the 2·ffn projection), "gelu", "rope" (per q/k element), "cast" (FP8
  // cast with its amax), "cross_entropy" (per logit), "embedding" (per looked-up element), "add".
  std::map<std::string, double> elementNs;
  double adamwNsPerParam = 0;  // AdamW's step with clipping, per float32 parameter
  // Communication overlapped with compute still lengthens the step by this share of its time (its
  // kernels take SMs and memory bandwidth from the compute beside them); overlapSource says how it
  // was obtained.
  double overlapSlowdown = 0.1;
  std::string overlapSource;
  Link intraNode;  // the link the card's GPUs were measured over (NVLink on SXM hosts)

  // Milliseconds of the GEMM: the exact sample, else the nearest (log-distance over m, n, k) of the
  // same op and precision scaled by FLOPs. No sample of that op and precision → tessera::Error.
  double gemmMs(const std::string& op, int64_t m, int64_t n, int64_t k, bool fp8) const;
  // Forward and backward milliseconds of causal attention at this shape on one rank of a
  // context-parallel group of `cp` (1: none), from the nearest sample scaled by
  // batch·heads·seq²·headDim (and by 1/cp when only a group of one's sample stands in).
  std::pair<double, double> attentionMs(int64_t batch, int64_t heads, int64_t kvHeads, int64_t seq,
                                        int64_t headDim, int cp = 1) const;
  double elementMs(const std::string& kind, double elements) const;  // unknown kind → Error
};

Calibration calibrationFromJson(const std::string& json, const std::string& what);
std::string calibrationToJson(const Calibration& c);
// The entry for `card` (exact name, or the only entry when card is empty) of a file holding
// {"calibrations": [...]}; none → Error listing the cards the file has.
Calibration loadCalibration(const std::string& path, const std::string& card = "");
// Adds or replaces (same card) the entry in the file, creating it when missing.
void saveCalibration(const std::string& path, const Calibration& c);

}  // namespace tessera::plan
