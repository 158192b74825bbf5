// Per-micro-batch compute and tensor/context-parallel communication of a block, the head and the
// embedding (contract in plan/costs.h).
#include <algorithm>

#include "plan/costs.h"
#include "plan/shapes.h"

namespace tessera::plan {

PassCost& PassCost::operator+=(const PassCost& o) {
  fwd += o.fwd, bwd += o.bwd, wgrad += o.wgrad;
  fwdComm += o.fwdComm, bwdComm += o.bwdComm, hiddenComm += o.hiddenComm;
  return *this;
}

PassCost PassCost::scaled(double k) const {
  return {fwd * k, bwd * k, wgrad * k, fwdComm * k, bwdComm * k, hiddenComm * k};
}

int64_t tokensPerMicro(const Workload& w, const Layout& l) { return l.microBatch * w.seqLen / l.cp; }

namespace {

// The elementwise kernels measured forward and backward together: a third forward, the rest back.
void elementwise(PassCost& c, const Calibration& cal, const char* kind, double elements) {
  const double ms = cal.elementMs(kind, elements);
  c.fwd += ms / 3;
  c.bwd += ms * 2 / 3;
}

}  // namespace

PassCost blockCost(const Workload& w, const Layout& l, const Calibration& cal, const Collectives& comm) {
  const auto& m = w.model;
  const bool llama = m.arch == models::Arch::Llama, sp = l.sp && l.tp > 1;
  const double t = static_cast<double>(tokensPerMicro(w, l));
  const double tElem = sp ? t / l.tp : t;
  PassCost c;
  for (const LinearShape& s : linearShapes(m, l.tp)) {
    if (!s.block) continue;
    const auto ti = static_cast<int64_t>(t);
    c.fwd += cal.gemmMs("fwd", ti, s.out, s.in, w.fp8);
    c.bwd += cal.gemmMs("dgrad", ti, s.in, s.out, w.fp8);
    c.wgrad += cal.gemmMs("wgrad", s.out, s.in, ti, w.fp8);
    if (w.fp8) {  // the activation's cast (and its transpose) forward, the gradient's backward
      c.fwd += cal.elementMs("cast", t * s.in);
      c.bwd += cal.elementMs("cast", t * s.out);
    }
  }
  const int64_t hd = m.headDim(), h = m.heads / l.tp, kv = std::max<int64_t>(1, m.kvH() / l.tp);
  const auto [af, ab] = cal.attentionMs(l.microBatch, h, kv, w.seqLen, hd, l.cp);  // this cp rank's share
  c.fwd += af, c.bwd += ab;
  PassCost e;
  elementwise(e, cal, llama ? "norm" : "layernorm", 2 * tElem * m.d);
  if (llama) elementwise(e, cal, "rope", t * (m.heads + m.kvH()) * hd / l.tp);
  const double act = t * m.ffnSize() / l.tp;
  elementwise(e, cal, llama ? "swiglu" : "gelu", llama ? 2 * act : act);
  c += e;
  if (w.recompute == RecomputeMode::Selective) {  // attention's core and the activation again
    c.bwd += af + cal.elementMs(llama ? "swiglu" : "gelu", llama ? 2 * act : act) / 3;
  } else if (w.recompute == RecomputeMode::Full) {
    c.bwd += c.fwd;
  }
  // Tensor parallel: [t, d] bf16 activations; SP all-gathers before and reduce-scatters after the
  // two parallel regions (4 forward), backward mirrors them; without SP two all-reduces each way.
  if (l.tp > 1) {
    const double bytes = t * m.d * 2;
    const double one =
        sp ? comm.ms("all_gather", bytes, l.tp, spanTp(l)) + comm.ms("reduce_scatter", bytes, l.tp, spanTp(l))
           : 2 * comm.ms("all_reduce", bytes, l.tp, spanTp(l));
    c.fwdComm += one;
    c.bwdComm += one;
  }
  if (l.cp > 1) {  // K and V all-gathered forward, their gradients reduce-scattered backward
    const double bytes = 2.0 * kv * hd * t * l.cp * 2;
    c.fwdComm += comm.ms("all_gather", bytes, l.cp, spanCp(l));
    c.bwdComm += comm.ms("reduce_scatter", bytes, l.cp, spanCp(l));
  }
  return c;
}

PassCost headCost(const Workload& w, const Layout& l, const Calibration& cal, const Collectives& comm) {
  const auto& m = w.model;
  const bool sp = l.sp && l.tp > 1;
  const double t = static_cast<double>(tokensPerMicro(w, l));
  const auto ti = static_cast<int64_t>(t);
  const LinearShape head = linearShapes(m, l.tp).back();
  PassCost c;
  c.fwd += cal.gemmMs("fwd", ti, head.out, head.in, false);
  c.bwd += cal.gemmMs("dgrad", ti, head.in, head.out, false);
  c.wgrad += cal.gemmMs("wgrad", head.out, head.in, ti, false);
  elementwise(c, cal, m.arch == models::Arch::Llama ? "norm" : "layernorm", (sp ? t / l.tp : t) * m.d);
  elementwise(c, cal, "cross_entropy", t * head.out);  // measured per logit, forward and backward
  if (sp) {
    const double bytes = t * m.d * 2;
    c.fwdComm += comm.ms("all_gather", bytes, l.tp, spanTp(l));
    c.bwdComm += comm.ms("reduce_scatter", bytes, l.tp, spanTp(l));
  }
  if (l.tp > 1) c.fwdComm += 2 * comm.ms("all_reduce", t * 4, l.tp, spanTp(l));  // the loss's row max and sums
  return c;
}

PassCost embeddingCost(const Workload& w, const Layout& l, const Calibration& cal) {
  PassCost c;
  elementwise(c, cal, "embedding", static_cast<double>(tokensPerMicro(w, l)) * w.model.d);
  return c;
}

double stageParams(const Workload& w, const Layout& l, int blocks, bool first, bool last) {
  const auto& m = w.model;
  double p = 0;
  for (int b = 0; b < blocks; ++b) p += static_cast<double>(models::blockParamCount(m, b));
  const double table = static_cast<double>(m.vocab) * m.d;
  if (first) p += table;
  if (last && !(first && m.tiedEmbeddings)) p += table;
  if (last) p += m.arch == models::Arch::Llama ? m.d : 2 * m.d;  // the final norm
  return p / l.tp;
}

}  // namespace tessera::plan
