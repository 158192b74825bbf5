// tessera._C.moe: the C++ mixture-of-experts layer (include/tessera/models/moe.h) for
// tessera.nn.MoE. The Python module owns the parameters and binds them into the layer (same
// TensorImpls), so autograd's gradients land on the Python parameters; forward is collective over
// the ep group (GIL released), its backward runs in autograd's engine.
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <string>

#include "bindings.h"
#include "tessera/common/error.h"
#include "tessera/models/moe.h"

namespace tessera::py {
namespace {

using models::MoeImpl;

struct MoeArgs {
  int64_t d, experts, topK, expertFfn, sharedFfn, layer;
  std::string score;
  bool normTopK;
  double routedScale, capacityFactor, auxLossCoef, zLossCoef, biasUpdateRate;
};

models::ModelConfig moeModel(const MoeArgs& a) {
  models::ModelConfig c;
  c.arch = models::Arch::Llama;
  c.d = a.d, c.layers = a.layer + 1, c.heads = 1, c.ffn = a.expertFfn;
  auto& m = c.moe;
  m.experts = a.experts, m.topK = a.topK, m.expertFfn = a.expertFfn, m.sharedFfn = a.sharedFfn;
  m.score = models::parseRouterScore(a.score);
  m.normTopK = a.normTopK, m.routedScale = a.routedScale, m.capacityFactor = a.capacityFactor;
  m.auxLossCoef = a.auxLossCoef, m.zLossCoef = a.zLossCoef, m.biasUpdateRate = a.biasUpdateRate;
  TESSERA_CHECK(a.d > 0 && a.expertFfn > 0 && a.topK >= 1 && a.topK <= a.experts && a.sharedFfn >= 0,
                "tessera.nn.MoE: d = {}, experts = {}, top_k = {}, expert_ffn = {}, shared_ffn = {}: need d, "
                "expert_ffn > 0, 1 <= top_k <= experts, shared_ffn >= 0",
                a.d, a.experts, a.topK, a.expertFfn, a.sharedFfn);
  return c;
}

// The layer's tensors by name (router, w1, w3, w2[, shared_w1, shared_w3, shared_w2], bias).
std::map<std::string, at::Tensor*> slots(MoeImpl& m) {
  std::map<std::string, at::Tensor*> s{{"router", &m.router}, {"w1", &m.w1}, {"w3", &m.w3}, {"w2", &m.w2},
                                       {"bias", &m.bias}};
  if (m.sw1.defined()) s.insert({{"shared_w1", &m.sw1}, {"shared_w3", &m.sw3}, {"shared_w2", &m.sw2}});
  return s;
}

// The layer computes with `given` from now on; its own first draw (still registered in the C++
// module) gives its memory back the first time it is replaced.
void bindTensors(MoeImpl& m, const std::map<std::string, at::Tensor>& given) {
  auto own = m.parameters(/*recurse=*/false);
  for (const auto& b : m.buffers(/*recurse=*/false)) own.push_back(b);
  for (auto& [name, slot] : slots(m)) {
    auto it = given.find(name);
    TESSERA_CHECK(it != given.end(), "tessera.nn.MoE: no tensor '{}' to bind", name);
    TESSERA_CHECK(it->second.sizes() == slot->sizes(), "tessera.nn.MoE: '{}' is [{}], the layer's is [{}]", name,
                  c10::str(it->second.sizes()), c10::str(slot->sizes()));
    const bool first = std::any_of(own.begin(), own.end(), [&](const at::Tensor& t) { return t.is_same(*slot); });
    if (first && !slot->is_same(it->second)) slot->set_data(at::empty({0}, slot->options()));
    *slot = it->second;
  }
}

}  // namespace

void bindMoe(pb::module_& parent) {
  auto m = parent.def_submodule("moe", "The mixture-of-experts layer (include/tessera/models/moe.h)");
  pb::class_<MoeImpl, std::shared_ptr<MoeImpl>>(m, "Moe")
      .def(pb::init([](int64_t d, int64_t experts, int64_t topK, int64_t expertFfn, int64_t sharedFfn,
                       const std::string& score, bool normTopK, double routedScale, double capacityFactor,
                       double auxLossCoef, double zLossCoef, double biasUpdateRate, int64_t layer, CommPtr ep,
                       CommPtr tp, bool sequenceParallel, double lossScale, uint64_t seed) {
             MoeArgs a{d,     experts, topK,     expertFfn,   sharedFfn,      layer,       score,
                       normTopK, routedScale, capacityFactor, auxLossCoef, zLossCoef, biasUpdateRate};
             return std::make_shared<MoeImpl>(moeModel(a), layer,
                                              models::MoeOptions{.ep = ep,
                                                                 .tp = tp,
                                                                 .sequenceParallel = sequenceParallel,
                                                                 .lossScale = lossScale,
                                                                 .seed = seed});
           }),
           pb::arg("d"), pb::arg("experts"), pb::arg("top_k"), pb::arg("expert_ffn"), pb::arg("shared_ffn"),
           pb::arg("score"), pb::arg("norm_topk"), pb::arg("routed_scale"), pb::arg("capacity_factor"),
           pb::arg("aux_loss_coef"), pb::arg("z_loss_coef"), pb::arg("bias_update_rate"), pb::arg("layer"),
           pb::arg("ep"), pb::arg("tp"), pb::arg("sequence_parallel"), pb::arg("loss_scale"), pb::arg("seed"))
      .def("tensors",
           [](MoeImpl& self) {
             std::map<std::string, at::Tensor> out;
             for (auto& [name, slot] : slots(self)) out[name] = slot->detach().clone();
             return out;
           })
      .def("bind", &bindTensors)
      .def(
          "forward",
          [](MoeImpl& self, const at::Tensor& x) {
            pb::gil_scoped_release nogil;
            return self.forward(x);
          },
          pb::arg("x"))
      .def_readwrite("fp8", &MoeImpl::fp8)
      .def_property_readonly("first_expert", &MoeImpl::firstExpert)
      .def_property_readonly("local_experts", &MoeImpl::localExperts)
      .def("take_stats",
           [](MoeImpl& self) {
             auto s = self.takeStats();
             return pb::dict(pb::arg("load") = s.load, pb::arg("dropped") = s.dropped, pb::arg("tokens") = s.tokens,
                             pb::arg("aux_loss") = s.auxLoss, pb::arg("z_loss") = s.zLoss);
           })
      .def(
          "update_bias",
          [](MoeImpl& self, const std::vector<CommPtr>& groups) {
            pb::gil_scoped_release nogil;
            self.updateBias(groups);
          },
          pb::arg("groups"));
}

}  // namespace tessera::py
