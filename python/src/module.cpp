// tessera._C: module entry, error types, build information.
#include <pybind11/stl.h>

#include "bindings.h"
#include "tessera/comm/backends.h"
#include "tessera/common/error.h"

namespace tessera::py {
namespace {

pb::dict buildInfo() {
  pb::dict d;
  d["version"] = TESSERA_VERSION;
#ifdef TESSERA_BUILT_HAVE_CUDA
  d["cuda"] = true;
#else
  d["cuda"] = false;
#endif
#ifdef TESSERA_BUILT_TORCH_CUDA
  d["torch_cuda"] = true;
#else
  d["torch_cuda"] = false;
#endif
  d["nccl"] = ncclAvailable();
  const std::string nv = ncclVersion();
  d["nccl_version"] = nv.empty() ? pb::object(pb::none()) : pb::object(pb::str(nv));
  d["gloo"] = glooAvailable();
#ifdef TESSERA_BUILT_HAVE_PMIX
  d["pmix"] = true;
#else
  d["pmix"] = false;
#endif
  d["torch_version"] = TESSERA_PY_TORCH_VERSION;  // the torch the module was built against
  d["cuda_devices"] = cudaDeviceCount();
  return d;
}

pb::exception<tessera::Error>* gError = nullptr;
pb::exception<tessera::CommError>* gCommError = nullptr;

}  // namespace
}  // namespace tessera::py

PYBIND11_MODULE(_C, m) {
  namespace pb = pybind11;
  using namespace tessera::py;
  m.doc() = "tessera's C++ runtime (see the `tessera` package for the documented API)";
  m.attr("__version__") = TESSERA_VERSION;

  // tessera::Error -> tessera.Error (a RuntimeError); tessera::CommError -> tessera.CommError
  // (a tessera.Error). The message is the C++ what() unchanged. The exception objects are
  // never destroyed (a static's destructor would run after the interpreter is gone).
  gError = new pb::exception<tessera::Error>(m, "Error", PyExc_RuntimeError);
  gCommError = new pb::exception<tessera::CommError>(m, "CommError", gError->ptr());
  pb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tessera::CommError& e) {
      (*gCommError)(e.what());
    } catch (const tessera::Error& e) {
      (*gError)(e.what());
    }
  });

  m.def("build_info", &buildInfo, "What this build of tessera contains (see tessera.build_info)");
  bindComm(m);
  bindMesh(m);
  bindDdp(m);
  bindTp(m);
  bindPipeline(m);
  bindFsdp(m);
  bindData(m);
  bindCheckpoint(m);
  bindModels(m);
  bindHf(m);
  bindTrain(m);
  bindMoe(m);
}
