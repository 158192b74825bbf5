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

// For every Comm action (rank, tick), the peer batches holding its ops' counterparts.
std::vector<std::vector<std::vector<BatchRef>>> counterparts(const Schedule& s) {
  // (from, to, is-send, k) → the batch holding the k-th such op.
  std::map<std::tuple<int, int, bool, int>, BatchRef> where;
  for (int r = 0; r < s.pp; ++r) {
    std::map<std::pair<int, bool>, int> count;
    for (size_t t = 0; t < s.ranks[r].size(); ++t) {
      for (const auto& c : s.ranks[r][t].comm) {
        where[{r, c.peer, isSend(c.kind), count[{c.peer, isSend(c.kind)}]++}] = {r, t};
      }
    }
  }
  std::vector<std::vector<std::vector<BatchRef>>> out(s.pp);
  for (int r = 0; r < s.pp; ++r) out[r].resize(s.ranks[r].size());
  for (const auto& [key, at] : where) {
    auto [r, peer, snd, k] = key;
    auto it = where.find({peer, r, !snd, k});
    TESSERA_CHECK(it != where.end(), "pipeline simulate: rank {}'s {}-th {} rank {} has no counterpart", r, k,
                  snd ? "send to" : "receive from", peer);
    out[at.rank][at.tick].push_back(it->second);
  }
  return out;
}

// One rank's replay: its compute and communication streams, how far it got, what arrived when.
struct RankState {
  size_t tick = 0;
  double compute = 0, comm = 0, end = 0, busy = 0;
  std::map<std::pair<int, int>, double> inAt, gradAt;  // (micro, chunk) → arrival
};

}  // namespace

SimulatedStep simulateStep(const Schedule& s, const std::vector<StageCost>& costs, double transfer) {
  TESSERA_CHECK(static_cast<int>(costs.size()) == s.numStages(),
                "pipeline simulate: {} stage costs for {} stages (pp {} x {} chunks)", costs.size(), s.numStages(),
                s.pp, s.chunks);
  for (size_t i = 0; i < costs.size(); ++i)
    TESSERA_CHECK(costs[i].forward >= 0 && costs[i].backward >= 0 && costs[i].weight >= 0 && transfer >= 0,
                  "pipeline simulate: negative cost (stage {}: forward {}, backward {}, weight {}; transfer {})", i,
                  costs[i].forward, costs[i].backward, costs[i].weight, transfer);
  const auto peers = counterparts(s);
  // A batch starts once its rank's compute stream reached it and its communication stream is free;
  // it ends `transfer` after it and all its counterparts have started. Each rank advances until it
  // needs a start not known yet; every sweep over the ranks advances one at least (the tables are
  // a DAG), so the replay visits each action once.
  std::vector<std::vector<double>> start(s.pp);
  std::vector<std::vector<char>> started(s.pp);
  for (int r = 0; r < s.pp; ++r) {
    start[r].assign(s.ranks[r].size(), 0);
    started[r].assign(s.ranks[r].size(), 0);
  }
  std::vector<RankState> st(s.pp);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < s.pp; ++r) {
      RankState& q = st[r];
      while (q.tick < s.ranks[r].size()) {
        const size_t t = q.tick;
        const auto& a = s.ranks[r][t];
        if (a.kind == Action::Comm) {
          if (!started[r][t]) start[r][t] = std::max(q.compute, q.comm), started[r][t] = 1, moved = true;
          double at = start[r][t];
          bool ready = true;
          for (const auto& p : peers[r][t]) {
            ready = ready && started[p.rank][p.tick];
            if (ready) at = std::max(at, start[p.rank][p.tick]);
          }
          if (!ready) break;
          q.comm = at + transfer;
          for (const auto& c : a.comm) {
            if (c.kind == CommKind::RecvForward) q.inAt[{c.micro, c.chunk}] = q.comm;
            if (c.kind == CommKind::RecvBackward) q.gradAt[{c.micro, c.chunk}] = q.comm;
          }
          q.end = std::max(q.end, q.comm);
        } else {
          const int stg = s.stageOf(r, a.chunk);
          const bool fwd = a.kind == Action::Forward, bwd = a.kind == Action::Backward;
          // ZB-V's turn (the neighbouring stage on this rank) needs no wait: it ran before on this stream.
          if (fwd && stg > 0 && s.localPrevChunk(r, a.chunk) < 0)
            q.compute = std::max(q.compute, q.inAt.at({a.micro, a.chunk}));
          if (bwd && stg < s.numStages() - 1 && s.localNextChunk(r, a.chunk) < 0)
            q.compute = std::max(q.compute, q.gradAt.at({a.micro, a.chunk}));
          const auto& k = costs[stg];
          const double c = fwd ? k.forward : bwd ? k.backward + (s.splitsBackward() ? 0 : k.weight) : k.weight;
          q.compute += c;
          q.busy += c;
        }
        ++q.tick;
        moved = true;
      }
    }
  }
  SimulatedStep out;
  for (int r = 0; r < s.pp; ++r) {
    TESSERA_CHECK(st[r].tick == s.ranks[r].size(),
                  "pipeline simulate: the {} tables for pp = {} do not settle (a cycle: rank {} waits at tick {})",
                  toString(s.kind), s.pp, r, st[r].tick);
    out.busy.push_back(st[r].busy);
    out.step = std::max({out.step, st[r].end, st[r].compute});
  }
  for (int r = 0; r < s.pp; ++r) out.idle.push_back(out.step - out.busy[r]);
  return out;
}

}  // namespace tessera::pipeline
