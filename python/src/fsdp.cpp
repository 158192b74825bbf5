// tessera._C: FullyShardedDataParallel and ShardedAdamW over parameters handed in from Python
// (src/parallel/data_parallel/fsdp). The parameters are the Python module's own tensors (the casters share
// the TensorImpl): construction turns each into a view of its unit's unsharded buffer, and
// the gradient hooks and pre-backward nodes FSDP attaches are C++, so backward never needs
// the GIL. run_unit releases the GIL for its all-gathers and reshards and takes it back only
// to call the unit's Python forward: a Gloo worker thread may need the GIL to drop the last
// reference to a tensor Python made (its PyObject then goes with it), so a thread that waits
// on communication while holding the GIL can deadlock with the very op it waits for (issue 27:
// the step's first all-gather queued behind the worker, which waited for the GIL to free the
// previous all-reduce's tensor).
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <torch/csrc/autograd/python_variable.h>  // THPVariable_Check

#include "bindings.h"
#include "tessera/common/error.h"
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"
#include "tessera/parallel/data_parallel/fsdp/optimizer.h"

namespace tessera::py {
namespace {

using Fsdp = FullyShardedDataParallel;

c10::ScalarType toDtype(const std::string& s, const char* what) {
  if (s == "torch.float32" || s == "float32" || s == "torch.float") return at::kFloat;
  if (s == "torch.bfloat16" || s == "bfloat16") return at::kBFloat16;
  if (s == "torch.float16" || s == "float16" || s == "torch.half") return at::kHalf;
  throw Error(std::string("FullyShardedDataParallel: ") + what + " '" + s +
              "' is not one of torch.float32, torch.bfloat16, torch.float16");
}

// The Python callable's result: one tensor, or a tuple/list of tensors.
std::vector<at::Tensor> tensorsOf(const pb::object& r, const std::string& unit) {
  if (THPVariable_Check(r.ptr())) return {r.cast<at::Tensor>()};
  if (pb::isinstance<pb::tuple>(r) || pb::isinstance<pb::list>(r)) {
    std::vector<at::Tensor> out;
    for (const auto& h : r) {
      TESSERA_CHECK(THPVariable_Check(h.ptr()),
                    "FullyShardedDataParallel: the forward of unit '{}' returned a sequence holding a {}; only "
                    "tensors can leave a unit",
                    unit, std::string(pb::str(h.get_type().attr("__name__"))));
      out.push_back(h.cast<at::Tensor>());
    }
    return out;
  }
  throw Error("FullyShardedDataParallel: the forward of unit '" + unit + "' returned a " +
              std::string(pb::str(r.get_type().attr("__name__"))) + "; it must return a tensor or a tuple of tensors");
}

struct NoSyncContext {
  std::shared_ptr<Fsdp> fsdp;
  std::unique_ptr<Fsdp::NoSync> guard;
};
struct KeepGatheredContext {
  std::shared_ptr<Fsdp> fsdp;
  std::unique_ptr<Fsdp::KeepGathered> guard;
};

void bindShardedAdamW(pb::module_& m);
// The shards, their layout and state dicts, the statistics.
void bindFsdpState(pb::class_<Fsdp, std::shared_ptr<Fsdp>>& cls);

}  // namespace

void bindFsdp(pb::module_& m) {
  pb::class_<NoSyncContext>(m, "_FsdpNoSync")
      .def("__enter__", [](NoSyncContext& c) { c.guard = std::make_unique<Fsdp::NoSync>(*c.fsdp); })
      .def("__exit__", [](NoSyncContext& c, const pb::args&) {
        c.guard.reset();
        return false;
      });
  pb::class_<KeepGatheredContext>(m, "_FsdpKeepGathered")
      .def("__enter__", [](KeepGatheredContext& c) { c.guard = std::make_unique<Fsdp::KeepGathered>(*c.fsdp); })
      .def("__exit__", [](KeepGatheredContext& c, const pb::args&) {
        pb::gil_scoped_release nogil;  // the reshards wait for gathers in flight
        c.guard.reset();
        return false;
      });

  // units: [(name, [(param name, tensor)], reshard_after_forward or None)]
  using UnitArg = std::tuple<std::string, std::vector<std::pair<std::string, at::Tensor>>, std::optional<bool>>;
  auto cls =
  pb::class_<Fsdp, std::shared_ptr<Fsdp>>(m, "FullyShardedDataParallel",
                                         "The C++ FSDP over named parameter units (see src/parallel/data_parallel/fsdp/fsdp.h); use "
                                         "tessera.FullyShardedDataParallel to wrap a torch.nn.Module")
      .def(pb::init([](std::vector<UnitArg> units, CommPtr comm, const std::string& paramDtype,
                       const std::string& reduceDtype, bool reshardAfterForward, size_t prefetchBudgetBytes,
                       int shardGroupSize, bool syncModuleStates) {
             std::vector<FsdpUnitSpec> specs;
             for (auto& [name, params, reshard] : units) specs.push_back({name, std::move(params), reshard, {}});
             FsdpOptions o;
             o.paramDtype = toDtype(paramDtype, "param_dtype");
             o.reduceDtype = toDtype(reduceDtype, "reduce_dtype");
             o.reshardAfterForward = reshardAfterForward;
             o.prefetchBudgetBytes = prefetchBudgetBytes;
             o.shardGroupSize = shardGroupSize;
             o.syncModuleStates = syncModuleStates;
             pb::gil_scoped_release nogil;  // collective: checks the units, broadcasts from rank 0
             return std::make_shared<Fsdp>(std::move(specs), std::move(comm), o);
           }),
           pb::arg("units"), pb::arg("comm"), pb::arg("param_dtype"), pb::arg("reduce_dtype"),
           pb::arg("reshard_after_forward"), pb::arg("prefetch_budget_bytes"), pb::arg("shard_group_size"),
           pb::arg("sync_module_states"))
      .def(
          "run_unit",
          [](Fsdp& f, size_t unit, const pb::function& fn) {
            const std::string name = unit < f.numUnits() ? f.unitName(unit) : "?";
            pb::gil_scoped_release nogil;  // gathers and reshards without it (see the top of this file)
            return f.runUnit(unit, std::vector<at::Tensor>{}, [&](const std::vector<at::Tensor>&) {
              pb::gil_scoped_acquire gil;  // the unit's Python forward, and its result's refcounts
              return tensorsOf(fn(), name);
            });
          },
          pb::arg("unit"), pb::arg("fn"),
          "Gathers the unit, calls fn() (which returns a tensor or a tuple of tensors), reshards; a list of the "
          "outputs")
      .def("no_sync", [](const std::shared_ptr<Fsdp>& f) { return NoSyncContext{f, nullptr}; })
      .def("keep_gathered", [](const std::shared_ptr<Fsdp>& f) { return KeepGatheredContext{f, nullptr}; })
      .def("zero_grad", &Fsdp::zeroGrad)
      .def("clip_grad_norm", &Fsdp::clipGradNorm, pb::arg("max_norm"), pb::call_guard<pb::gil_scoped_release>())
      .def("full_state_dict", &Fsdp::fullStateDict, pb::call_guard<pb::gil_scoped_release>())
      .def("load_full_state_dict", &Fsdp::loadFullStateDict, pb::arg("state_dict"),
           pb::call_guard<pb::gil_scoped_release>());
  bindFsdpState(cls);
  bindShardedAdamW(m);
}

namespace {

void bindFsdpState(pb::class_<Fsdp, std::shared_ptr<Fsdp>>& cls) {
  cls.def("sharded_state_dict", &Fsdp::shardedStateDict)
      .def("load_sharded_state_dict", &Fsdp::loadShardedStateDict, pb::arg("state_dict"))
      .def("reshard_all", &Fsdp::reshardAll, pb::call_guard<pb::gil_scoped_release>())  // waits on prefetches
      .def("unshard_all", &Fsdp::unshardAll, pb::call_guard<pb::gil_scoped_release>())
      .def("master_shard", &Fsdp::masterShard, pb::arg("unit"))
      .def("gather_full", &Fsdp::gatherFull, pb::arg("unit"), pb::arg("shard"), pb::call_guard<pb::gil_scoped_release>(),
           "Collective over the shard group: the unit's flat buffer from every rank's shard (zero-padded)")
      .def("grad_shard", &Fsdp::gradShard, pb::arg("unit"))
      .def("set_grad_views", &Fsdp::setGradViews, pb::arg("unit"), pb::arg("views"),
           "[(offset in this rank's shard, float32 leaf aliasing the master shard there)]: their .grad become the "
           "gradient shard (src/parallel/data_parallel/fsdp/fsdp.h)")
      .def_property_readonly("shard_rank", &Fsdp::shardRank)
      .def_property_readonly("shard_group", [](const Fsdp& f) { return f.shardGroup(); })
      .def(
          "layout",
          [](const Fsdp& f, size_t u) {
            const auto& l = f.layout(u);
            pb::list entries;
            for (const auto& e : l.entries) entries.append(pb::make_tuple(e.name, e.shape, e.offset, e.numel, e.trainable));
            pb::dict d;
            d["entries"] = entries;  // flat order: trainable first, then frozen
            d["numel"] = l.numel;
            d["trainable_numel"] = l.trainableNumel;
            d["padded_numel"] = l.paddedNumel;
            d["shard_numel"] = l.shardNumel;
            d["shards"] = l.shards;
            return d;
          },
          pb::arg("unit"))
      .def_property_readonly("num_units", &Fsdp::numUnits)
      .def("unit_name", &Fsdp::unitName, pb::arg("unit"))
      .def("stats", [](const Fsdp& f) {
        const auto& s = f.stats();
        return std::map<std::string, int64_t>{{"peak_unsharded_units", s.peakUnshardedUnits},
                                              {"peak_unsharded_bytes", static_cast<int64_t>(s.peakUnshardedBytes)},
                                              {"all_gathers", s.allGathers},
                                              {"prefetches", s.prefetches},
                                              {"reduce_scatters", s.reduceScatters}};
      });
}

void bindShardedAdamW(pb::module_& m) {
  pb::class_<ShardedAdamW, std::shared_ptr<ShardedAdamW>>(
      m, "ShardedAdamW", "AdamW on FSDP's fp32 shards (src/parallel/data_parallel/fsdp/optimizer.h); keeps the FSDP object alive")
      .def(pb::init([](std::shared_ptr<Fsdp> f, double lr, double beta1, double beta2, double eps, double wd,
                       const pb::object& decays) {
             AdamWOptions o{lr, beta1, beta2, eps, wd};
             ShardedAdamW::DecayRule rule;
             if (!decays.is_none()) {  // called during construction only, with the GIL held
               rule = [decays](const std::string& name) { return decays(name).cast<bool>(); };
             }
             // The optimizer holds a reference: keep the FSDP object alive as long as it is.
             auto* raw = new ShardedAdamW(*f, o, rule);
             return std::shared_ptr<ShardedAdamW>(raw, [f](ShardedAdamW* p) { delete p; });
           }),
           pb::arg("fsdp"), pb::arg("lr") = 1e-3, pb::arg("beta1") = 0.9, pb::arg("beta2") = 0.999,
           pb::arg("eps") = 1e-8, pb::arg("weight_decay") = 1e-2, pb::arg("decays") = pb::none())
      .def_property(
          "lr", [](ShardedAdamW& a) { return a.options().lr; }, [](ShardedAdamW& a, double lr) { a.options().lr = lr; })
      .def("state_dict", &ShardedAdamW::stateDict)
      .def("load_state_dict", &ShardedAdamW::loadStateDict, pb::arg("state_dict"))
      .def("step", [](ShardedAdamW& a) { a.step(); }, pb::call_guard<pb::gil_scoped_release>())
      .def("zero_grad", &ShardedAdamW::zeroGrad)
      .def_property_readonly("steps", &ShardedAdamW::steps);
}

}  // namespace

}  // namespace tessera::py
