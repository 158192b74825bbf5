// tessera._C: DistributedDataParallel over parameters handed in from Python.
//
// The torch.Tensor -> at::Tensor caster shares the TensorImpl (and its autograd meta), so the
// gradient-accumulator hooks the C++ reducer registers are on the Python module's very
// parameters: they fire during a backward started from Python (loss.backward()), which runs
// in autograd's engine with the GIL released; the reducer never touches Python objects.
#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "bindings.h"
#include "tessera/comm/settings.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"

namespace tessera::py {
namespace {

std::optional<c10::ScalarType> toCommDtype(const std::optional<std::string>& s) {
  if (!s) return std::nullopt;
  if (*s == "torch.bfloat16" || *s == "bfloat16") return at::kBFloat16;
  if (*s == "torch.float16" || *s == "float16" || *s == "torch.half") return at::kHalf;
  if (*s == "torch.float32" || *s == "float32" || *s == "torch.float") return at::kFloat;
  throw Error("DistributedDataParallel: comm_dtype '" + *s + "' is not one of torch.bfloat16, torch.float16, "
              "torch.float32");
}

// The C++ guard is neither copyable nor movable: held through a unique_ptr for Python's
// `with` statement (__enter__ creates it, __exit__ destroys it, restoring the previous mode).
struct NoSyncContext {
  std::shared_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<DistributedDataParallel::NoSync> guard;
};

}  // namespace

void bindDdp(pb::module_& m) {
  using Ddp = DistributedDataParallel;
  pb::class_<NoSyncContext>(m, "_NoSync")
      .def("__enter__", [](NoSyncContext& c) { c.guard = std::make_unique<Ddp::NoSync>(*c.ddp); })
      .def("__exit__", [](NoSyncContext& c, const pb::args&) {
        c.guard.reset();
        return false;
      });

  pb::class_<Ddp, std::shared_ptr<Ddp>>(m, "DistributedDataParallel",
                                        "The C++ reducer over named parameters (see src/parallel/ddp/ddp.h); "
                                        "use tessera.DistributedDataParallel to wrap a torch.nn.Module")
      .def(pb::init([](Ddp::Named params, Ddp::Named buffers, CommPtr comm, size_t bucketCapBytes,
                       size_t firstBucketCapBytes, bool gradientAsBucketView, std::optional<std::string> commDtype,
                       bool findUnused, bool broadcastBuffers, bool rebuildBuckets) {
             DdpOptions o;
             o.bucketCapBytes = bucketCapBytes;
             o.firstBucketCapBytes = firstBucketCapBytes;
             o.gradientAsBucketView = gradientAsBucketView;
             o.commDtype = toCommDtype(commDtype);
             o.findUnusedParameters = findUnused;
             o.broadcastBuffers = broadcastBuffers;
             o.rebuildBuckets = rebuildBuckets;
             o.smCarveout = settings().smCarveout;  // TESSERA_OVERLAP_SM_CARVEOUT, as tessera.init() read it
             pb::gil_scoped_release nogil;  // collective: checks shapes, broadcasts from rank 0
             return std::make_shared<Ddp>(std::move(params), std::move(buffers), std::move(comm), o);
           }),
           pb::arg("parameters"), pb::arg("buffers"), pb::arg("comm"), pb::arg("bucket_cap_bytes") = 25u << 20,
           pb::arg("first_bucket_cap_bytes") = 1u << 20, pb::arg("gradient_as_bucket_view") = false,
           pb::arg("comm_dtype") = pb::none(), pb::arg("find_unused_parameters") = false,
           pb::arg("broadcast_buffers") = true, pb::arg("rebuild_buckets") = true)
      .def("sync_buffers", &Ddp::syncBuffers, pb::call_guard<pb::gil_scoped_release>(),
           "Collective when broadcast_buffers: buffers from rank 0.")
      .def("zero_grad", &Ddp::zeroGrad, "Local: zero every .grad in place (keeps bucket views).")
      .def(
          "no_sync", [](const std::shared_ptr<Ddp>& d) { return NoSyncContext{d, nullptr}; },
          "Context manager: backward passes inside only accumulate .grad locally.")
      .def("bucket_layout", &Ddp::bucketLayout, "Parameter names per bucket, in bucket order.")
      .def_property_readonly("comm", &Ddp::comm);
}

}  // namespace tessera::py
