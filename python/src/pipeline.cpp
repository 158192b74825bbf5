// tessera._C: the pipeline schedule executor (src/parallel/pipeline/executor.h) over Python callables.
//
// step() releases the GIL for the whole schedule: communication, the executor's bookkeeping and
// autograd's backward run without it; each call of a stage or loss callable takes it back for
// its duration (pybind11's std::function wrapper acquires the GIL around the Python call).
// A Python exception in a stage becomes the executor's error ("pipeline executor: forward of
// micro-batch 3 on stage 1 ... failed: <the Python error>"), raised as tessera.Error.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "tessera/common/error.h"
#include "tessera/parallel/pipeline/executor.h"
#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::py {
namespace {

using pipeline::PipelineExecutor;
using pipeline::ScheduleKind;

ScheduleKind toScheduleKind(const std::string& s) {
  if (s == "gpipe") return ScheduleKind::GPipe;
  if (s == "1f1b") return ScheduleKind::OneFOneB;
  if (s == "interleaved_1f1b" || s == "interleaved") return ScheduleKind::Interleaved1F1B;
  if (s == "zb_h1" || s == "zb-h1") return ScheduleKind::ZeroBubbleH1;
  if (s == "zbv" || s == "zb_v") return ScheduleKind::ZeroBubbleV;
  throw Error("tessera pipeline: schedule '" + s + "' is not one of gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv");
}

// step / evaluate with the GIL released (the executor takes it back for each stage call).
at::Tensor run(PipelineExecutor& e, at::Tensor (PipelineExecutor::*fn)(const at::Tensor&, const at::Tensor&),
               const std::optional<at::Tensor>& input, const std::optional<at::Tensor>& target) {
  pb::gil_scoped_release nogil;
  return (e.*fn)(input.value_or(at::Tensor()), target.value_or(at::Tensor()));
}

}  // namespace

void bindPipeline(pb::module_& m) {
  pb::class_<PipelineExecutor, std::shared_ptr<PipelineExecutor>>(
      m, "PipelineExecutor",
      "Runs one schedule table over this rank's stage callables (see src/parallel/pipeline/executor.h); use "
      "tessera.Pipeline to run torch.nn.Modules")
      .def(pb::init([](CommPtr group, const std::string& schedule, int microBatches,
                       std::vector<PipelineExecutor::ChunkFn> stages, PipelineExecutor::LossFn loss,
                       const std::string& device, bool freeSentOutputs, int extraWarmup) {
             TESSERA_CHECK(group, "tessera pipeline: no pp communicator given");
             TESSERA_CHECK(!stages.empty(), "tessera pipeline: no stage given on rank {}", group->rank());
             pipeline::ExecutorOptions o;
             o.device = at::Device(device);
             o.freeSentOutputs = freeSentOutputs;
             auto sched = pipeline::makeSchedule(toScheduleKind(schedule), group->size(), microBatches,
                                                 static_cast<int>(stages.size()), extraWarmup);
             return std::make_shared<PipelineExecutor>(std::move(group), std::move(sched), std::move(stages),
                                                       std::move(loss), o);
           }),
           pb::arg("group"), pb::arg("schedule"), pb::arg("micro_batches"), pb::arg("stages"), pb::arg("loss"),
           pb::arg("device"), pb::arg("free_sent_outputs") = true, pb::arg("extra_warmup") = 0)
      .def(
          "step",
          [](PipelineExecutor& e, const std::optional<at::Tensor>& input, const std::optional<at::Tensor>& target) {
            return run(e, &PipelineExecutor::step, input, target);
          },
          pb::arg("input") = pb::none(), pb::arg("target") = pb::none(),
          "One training step (collective over the pp group): forward and backward of every micro-batch; "
          "gradients accumulate into the stages' parameters. Returns the mean loss on every rank.")
      .def(
          "evaluate",
          [](PipelineExecutor& e, const std::optional<at::Tensor>& input, const std::optional<at::Tensor>& target) {
            return run(e, &PipelineExecutor::evaluate, input, target);
          },
          pb::arg("input") = pb::none(), pb::arg("target") = pb::none(),
          "Forward only under no_grad (validation), collective over the pp group; the mean loss on every rank.")
      .def_property_readonly("peak_in_flight", &PipelineExecutor::peakInFlight)
      .def("describe", [](const PipelineExecutor& e, int rank) { return e.schedule().describe(rank); },
           pb::arg("rank"), "This schedule's actions on `rank`, one per line");
}

}  // namespace tessera::py
