#include "tessera/nn/rope.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/rotary.h"

namespace tessera::nn {

at::Tensor ropeInvFreq(int64_t headDim, double theta, const RopeScaling& s) {
  auto f = at::empty({headDim / 2}, at::kDouble);
  auto* p = f.data_ptr<double>();
  for (int64_t i = 0; i < headDim / 2; ++i) {
    double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(headDim));
    if (s.enabled) {  // Llama 3.1's apply_scaling
      const double lowWavelen = s.originalMaxPositions / s.lowFreqFactor;
      const double highWavelen = s.originalMaxPositions / s.highFreqFactor;
      const double wavelen = 2 * M_PI / freq;
      if (wavelen > lowWavelen) {
        freq /= s.factor;
      } else if (wavelen >= highWavelen) {
        const double smooth =
            (s.originalMaxPositions / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
        freq = (1 - smooth) * freq / s.factor + smooth * freq;
      }
    }
    p[i] = freq;
  }
  return f;
}

RopeTables ropeTables(int64_t seqLen, int64_t headDim, double theta, const RopeScaling& s, at::Device device) {
  using Key = std::tuple<int64_t, int64_t, double, bool, double, double, double, int64_t, std::string>;
  static std::mutex mu;
  static std::map<Key, RopeTables> cache;
  const Key key{seqLen, headDim, theta, s.enabled, s.factor, s.lowFreqFactor, s.highFreqFactor, s.originalMaxPositions,
                device.str()};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  auto pos = at::arange(seqLen, at::kDouble).unsqueeze(1);
  auto angles = pos * ropeInvFreq(headDim, theta, s).unsqueeze(0);  // [T, hd/2], float64
  angles = at::cat({angles, angles}, 1);
  RopeTables t{angles.cos().to(at::kFloat).to(device), angles.sin().to(at::kFloat).to(device)};
  cache.emplace(key, t);
  return t;
}

at::Tensor applyRope(const at::Tensor& x, const RopeTables& t) {
  const int64_t T = x.size(0), hd = x.size(-1);
  auto cos = t.cos.narrow(0, 0, T).view({T, 1, 1, hd});
  auto sin = t.sin.narrow(0, 0, T).view({T, 1, 1, hd});
  auto xf = x.to(at::kFloat);
  auto halves = xf.chunk(2, -1);
  auto rotated = at::cat({-halves[1], halves[0]}, -1);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

namespace {

// In place in h's memory (see rope.h); the output aliases h without being autograd's view of it.
struct RopeQk : torch::autograd::Function<RopeQk> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h, int64_t heads,
                            const at::Tensor& cos, const at::Tensor& sin) {
    kernels::ropeInPlace(h, heads, cos.size(1), cos, sin);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["heads"] = heads;
    return h.detach();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t heads = ctx->saved_data["heads"].toInt();
    return {kernels::ropeBackward(grads[0], heads, saved[0].size(1), saved[0], saved[1]), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor ropeQkInPlace(const at::Tensor& h, int64_t heads, const RopeTables& t) {
  return RopeQk::apply(h.contiguous(), heads, t.cos, t.sin);
}

}  // namespace tessera::nn
