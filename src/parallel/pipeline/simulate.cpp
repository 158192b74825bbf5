// Replays schedule tables with stage costs (contract in simulate.h).
#include "tessera/parallel/pipeline/simulate.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "tessera/common/error.h"

namespace tessera::pipeline {

namespace {

struct BatchRef {
  int rank = 0;
  size_t tick = 0;
};

// For every Comm action, the peer batches holding its ops' counterparts.
std::map<std::pair<int, size_t>, std::vector<BatchRef>> counterparts(const Schedule& s) {
  // (from, to, is-send, k) → the batch holding the k-th such op.
  std::map<std::tuple<int, int, bool, int>, BatchRef> where;
  for (int r = 0; r < s.pp; ++r) {
    std::map<std::pair<int, bool>, int> count;
    for (size_t t = 0; t < s.ranks[r].size(); ++t)
      for (const auto& c : s.ranks[r][t].comm) where[{r, c.peer, isSend(c.kind), count[{c.peer, isSend(c.kind)}]++}] = {r, t};
  }
  std::map<std::pair<int, size_t>, std::vector<BatchRef>> out;
  for (const auto& [key, at] : where) {
    auto [r, peer, snd, k] = key;
    auto it = where.find({peer, r, !snd, k});
    TESSERA_CHECK(it != where.end(), "pipeline simulate: rank {}'s {}-th {} rank {} has no counterpart", r, k,
                  snd ? "send to" : "receive from", peer);
    out[{at.rank, at.tick}].push_back(it->second);
  }
  return out;
}

}  // namespace

SimulatedStep simulateStep(const Schedule& s, const std::vector<StageCost>& costs, double transfer) {
  TESSERA_CHECK(static_cast<int>(costs.size()) == s.numStages(),
                "pipeline simulate: {} stage costs for {} stages (pp {} x {} chunks)", costs.size(), s.numStages(), s.pp,
                s.chunks);
  for (size_t i = 0; i < costs.size(); ++i)
    TESSERA_CHECK(costs[i].forward >= 0 && costs[i].backward >= 0 && costs[i].weight >= 0 && transfer >= 0,
                  "pipeline simulate: negative cost (stage {}: forward {}, backward {}, weight {}; transfer {})", i,
                  costs[i].forward, costs[i].backward, costs[i].weight, transfer);
  const auto peers = counterparts(s);
  // done[(rank, tick)]: when that batch finishes. Start from 0 and replay until nothing moves:
  // each pass can only push times later, and the tables' dependencies form a DAG (no
  // deadlock), so this settles after at most one pass per batch.
  std::map<std::pair<int, size_t>, double> done, start;
  for (const auto& [key, unused] : peers) done[key] = 0;
  SimulatedStep out;
  const size_t maxPasses = peers.size() + 2;
  for (size_t pass = 0;; ++pass) {
    TESSERA_CHECK(pass <= maxPasses, "pipeline simulate: the {} tables for pp = {} do not settle (a cycle)",
                  toString(s.kind), s.pp);
    out = {};
    out.busy.assign(s.pp, 0);
    out.idle.assign(s.pp, 0);
    for (int r = 0; r < s.pp; ++r) {
      double compute = 0, comm = 0, end = 0;
      std::map<std::pair<int, int>, double> inAt, gradAt;  // (micro, chunk) → arrival
      for (size_t t = 0; t < s.ranks[r].size(); ++t) {
        const auto& a = s.ranks[r][t];
        if (a.kind == Action::Comm) {
          start[{r, t}] = std::max(compute, comm);
          comm = done[{r, t}];
          for (const auto& c : a.comm) {
            if (c.kind == CommKind::RecvForward) inAt[{c.micro, c.chunk}] = comm;
            if (c.kind == CommKind::RecvBackward) gradAt[{c.micro, c.chunk}] = comm;
          }
          end = std::max(end, comm);
          continue;
        }
        const int st = s.stageOf(r, a.chunk);
        const bool fwd = a.kind == Action::Forward, bwd = a.kind == Action::Backward;
        // ZB-V's turn (the neighbouring stage on this rank) needs no wait: it ran before on this stream.
        if (fwd && st > 0 && s.localPrevChunk(r, a.chunk) < 0) compute = std::max(compute, inAt.at({a.micro, a.chunk}));
        if (bwd && st < s.numStages() - 1 && s.localNextChunk(r, a.chunk) < 0)
          compute = std::max(compute, gradAt.at({a.micro, a.chunk}));
        const auto& k = costs[st];
        const double c = fwd ? k.forward : bwd ? k.backward + (s.splitsBackward() ? 0 : k.weight) : k.weight;
        compute += c;
        out.busy[r] += c;
      }
      end = std::max(end, compute);
      out.step = std::max(out.step, end);
    }
    bool moved = false;
    for (auto& [key, d] : done) {
      double t = start.at(key);
      for (const auto& p : peers.at(key)) t = std::max(t, start.at({p.rank, p.tick}));
      if (t + transfer > d) d = t + transfer, moved = true;
    }
    // A batch also finishes after the one before it on its rank's communication stream, which the
    // replay above accounts for through `comm` on the next pass.
    if (!moved) break;
  }
  for (int r = 0; r < s.pp; ++r) out.idle[r] = out.step - out.busy[r];
  return out;
}

}  // namespace tessera::pipeline
