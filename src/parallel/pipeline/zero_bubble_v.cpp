// ZB-V's compute order as a greedy list schedule (the zero-bubble paper's heuristic for its V-shaped
// schedule): every action costs one tick, a result reaches the next stage in the next tick, and
// each rank runs per tick the first of: the oldest ready B (the later stage first), a ready F while
// fewer than 2·P chunk activations are alive on it (chunk 1 first: it leads to the loss), the
// oldest ready W. Each stage runs its micro-batches in order. The orders it yields respect every
// dependency of the timeline it simulated, so schedule.cpp's lock-step placement of the transfers
// always proceeds.
#include "parallel/pipeline/zero_bubble_v.h"

#include "tessera/common/error.h"

namespace tessera::pipeline::detail {

std::vector<std::vector<Action>> zeroBubbleVOrders(int P, int M) {
  const int S = 2 * P;
  // Per stage: the next micro-batch of F, B, W, and the tick each micro-batch's F and B finished.
  std::vector<int> nextF(S, 0), nextB(S, 0), nextW(S, 0);
  std::vector<std::vector<int>> fAt(S, std::vector<int>(M, -1)), bAt(S, std::vector<int>(M, -1));
  std::vector<int> alive(P, 0);
  std::vector<std::vector<Action>> out(P);
  const int limit = 2 * P;
  auto act = [](Action::Kind k, int m, int c) {
    Action a;
    a.kind = k, a.micro = m, a.chunk = c;
    return a;
  };
  int left = 3 * S * M;
  for (int tick = 0; left > 0; ++tick) {
    TESSERA_CHECK(tick < 16 * S * M + 64, "pipeline schedule: internal error: ZB-V for pp = {}, {} micro-batches "
                  "does not finish", P, M);
    for (int r = 0; r < P; ++r) {
      const int stages[2] = {S - 1 - r, r};  // chunk 1's stage first
      auto readyB = [&](int s) {
        const int m = nextB[s];
        return m < M && fAt[s][m] >= 0 && fAt[s][m] < tick && (s == S - 1 || (bAt[s + 1][m] >= 0 && bAt[s + 1][m] < tick));
      };
      auto readyF = [&](int s) {
        const int m = nextF[s];
        return m < M && (s == 0 || (fAt[s - 1][m] >= 0 && fAt[s - 1][m] < tick));
      };
      int pick = -1;
      Action::Kind kind = Action::Forward;
      // The oldest ready B (the later stage on ties).
      for (int s : stages) {
        if (readyB(s) && (pick < 0 || nextB[s] < nextB[pick])) pick = s, kind = Action::Backward;
      }
      if (pick < 0 && alive[r] < limit) {
        for (int s : stages) {
          if (readyF(s)) {
            pick = s, kind = Action::Forward;
            break;
          }
        }
      }
      if (pick < 0) {
        for (int s : stages) {
          const int m = nextW[s];
          if (m < M && bAt[s][m] >= 0 && bAt[s][m] < tick && (pick < 0 || m < nextW[pick])) {
            pick = s, kind = Action::WeightGrad;
          }
        }
      }
      if (pick < 0) continue;
      const int c = pick < P ? 0 : 1;
      int m = 0;
      if (kind == Action::Forward) {
        m = nextF[pick]++;
        fAt[pick][m] = tick;
        ++alive[r];
      } else if (kind == Action::Backward) {
        m = nextB[pick]++;
        bAt[pick][m] = tick;
      } else {
        m = nextW[pick]++;
        --alive[r];
      }
      out[r].push_back(act(kind, m, c));
      --left;
    }
  }
  return out;
}

}  // namespace tessera::pipeline::detail
