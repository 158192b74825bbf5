// tessera._C.train: the C++ trainer (src/train) for tessera.train: Config from flags or a TOML file,
// the Trainer's calls with the GIL released (they are collective and long), StepReport as a dict.
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <fmt/format.h>

#include <optional>

#include "bindings.h"
#include "tessera/comm/bootstrap/init.h"
#include "tessera/train/config.h"
#include "tessera/train/trainer.h"

namespace tessera::py {

void bindTrain(pb::module_& m) {
  auto t = m.def_submodule("train", "tessera's trainer (src/train): see tessera.train");
  pb::register_exception<train::UsageError>(t, "UsageError", m.attr("Error").ptr());
  pb::register_exception<train::NonFiniteError>(t, "NonFiniteError", m.attr("Error").ptr());
  using R = train::StepReport;
  pb::class_<R>(t, "StepReport", "One step's results (src/train/trainer.h); times in ms, memory in GiB")
      .def_readonly("step", &R::step)
      .def_readonly("loss", &R::loss)
      .def_readonly("grad_norm", &R::gradNorm)
      .def_readonly("lr", &R::lr)
      .def_readonly("step_ms", &R::stepMs)
      .def_readonly("tokens_per_s", &R::tokensPerS)
      .def_property_readonly("mfu", [](const R& r) { return r.mfu >= 0 ? std::optional<double>(r.mfu) : std::nullopt; })
      .def_readonly("peak_mem_gib", &R::peakMemGiB)
      .def_property_readonly(
          "valid_loss", [](const R& r) { return r.validLoss >= 0 ? std::optional<double>(r.validLoss) : std::nullopt; })
      .def_readonly("pipeline_ms", &R::pipelineMs)
      .def_readonly("optimizer_ms", &R::optimizerMs)
      .def_readonly("non_finite", &R::nonFinite)
      .def_readonly("skipped", &R::skipped)
      .def_readonly("fp8_values", &R::fp8Values)
      .def("__repr__", [](const R& r) {
        return fmt::format("StepReport(step={}, loss={:.6f}, grad_norm={:.4f}, step_ms={:.1f})", r.step, r.loss,
                           r.gradNorm, r.stepMs);
      });
  pb::class_<train::Config>(t, "Config", "A run's configuration (src/train/config.h)")
      .def_static(
          "parse",
          [](const std::vector<std::string>& args) { return train::Config::parse(args, train::Machine::detect()); },
          pb::arg("args"), "train_gpt's flags (and the --config file they name) on this machine's defaults")
      .def("to_toml", &train::Config::toToml)
      .def("describe", &train::Config::describe)
      .def("resolve", &train::Config::resolve, pb::arg("world"))
      .def_property_readonly("help", [](const train::Config& c) { return c.help; });
  t.def("usage", [] { return train::usage(train::Machine::detect()); }, "train_gpt --help's text on this machine");
  pb::class_<train::Trainer>(t, "Trainer", "The C++ Trainer (src/train/trainer.h); collective over the world")
      .def(pb::init([](const train::Config& c, const std::shared_ptr<Context>& ctx) {
             pb::gil_scoped_release nogil;
             return std::make_unique<train::Trainer>(c, *ctx);
           }),
           pb::arg("config"), pb::arg("context"))
      .def("restore", &train::Trainer::restore, pb::call_guard<pb::gil_scoped_release>())
      .def("step", pb::overload_cast<>(&train::Trainer::step), pb::call_guard<pb::gil_scoped_release>())
      .def(
          "step_on",
          [](train::Trainer& tr, const at::Tensor& tokens, const at::Tensor& targets) {
            return tr.step(data::TokenBatch{tokens, targets});
          },
          pb::arg("tokens"), pb::arg("targets"), pb::call_guard<pb::gil_scoped_release>())
      .def("evaluate", &train::Trainer::evaluate, pb::call_guard<pb::gil_scoped_release>())
      .def("save", &train::Trainer::save, pb::call_guard<pb::gil_scoped_release>())
      .def("export_hf", &train::Trainer::exportHf, pb::arg("dir"), pb::call_guard<pb::gil_scoped_release>())
      .def(
          "fit",
          [](train::Trainer& tr, const pb::object& onStep) {
            std::function<void(const train::StepReport&)> each;
            if (!onStep.is_none()) {
              each = [onStep](const train::StepReport& r) {
                pb::gil_scoped_acquire gil;
                onStep(r);
              };
            }
            std::vector<train::StepReport> out;
            {
              pb::gil_scoped_release nogil;
              out = tr.fit(each);
            }
            return out;
          },
          pb::arg("on_step") = pb::none())
      .def("log", &train::Trainer::log, pb::arg("report"))
      .def_property_readonly("steps_done", &train::Trainer::stepsDone)
      .def_property_readonly("config", &train::Trainer::config, pb::return_value_policy::copy);
}

}  // namespace tessera::py
