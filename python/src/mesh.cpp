// tessera._C: ProcessMesh, the dp x pp x tp grid of a world's ranks and its groups.
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "tessera/parallel/process_mesh.h"

namespace tessera::py {

void bindMesh(pb::module_& m) {
  pb::class_<ProcessMesh, std::shared_ptr<ProcessMesh>>(m, "ProcessMesh",
                                                        "dp x pp x tp, tp fastest-varying (see process_mesh.h)")
      .def(pb::init([](CommPtr world, int dp, int pp, int tp) {
             pb::gil_scoped_release nogil;
             return std::make_shared<ProcessMesh>(std::move(world), dp, pp, tp);
           }),
           pb::arg("world"), pb::arg("dp"), pb::arg("pp"), pb::arg("tp"))
      .def_property_readonly("dp_size", &ProcessMesh::dpSize)
      .def_property_readonly("pp_size", &ProcessMesh::ppSize)
      .def_property_readonly("tp_size", &ProcessMesh::tpSize)
      .def_property_readonly("rank", &ProcessMesh::rank)
      .def_property_readonly("coord",
                             [](const ProcessMesh& m) {
                               auto c = m.coord();
                               return pb::make_tuple(c.dp, c.pp, c.tp);
                             })
      .def(
          "coord_of",
          [](const ProcessMesh& m, int r) {
            auto c = m.coordOf(r);
            return pb::make_tuple(c.dp, c.pp, c.tp);
          },
          pb::arg("rank"))
      .def(
          "rank_of",
          [](const ProcessMesh& m, int dp, int pp, int tp) {
            return m.rankOf(MeshCoord{dp, pp, tp});
          },
          pb::arg("dp"), pb::arg("pp"), pb::arg("tp"))
      .def(
          "group_ranks",
          [](const ProcessMesh& m, const std::string& axis) {
            if (axis == "dp") return m.groupRanks(MeshAxis::Data);
            if (axis == "pp") return m.groupRanks(MeshAxis::Pipeline);
            if (axis == "tp") return m.groupRanks(MeshAxis::Tensor);
            throw Error("ProcessMesh.group_ranks: axis '" + axis + "' is not one of dp, pp, tp");
          },
          pb::arg("axis"))
      .def_property_readonly("world", &ProcessMesh::world)
      .def_property_readonly("dp", &ProcessMesh::dpGroup)
      .def_property_readonly("pp", &ProcessMesh::ppGroup)
      .def_property_readonly("tp", &ProcessMesh::tpGroup)
      .def("__repr__", [](const ProcessMesh& m) { return "<tessera.ProcessMesh " + m.describe() + ">"; });
}

}  // namespace tessera::py
