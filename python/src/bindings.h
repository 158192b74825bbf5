#pragma once
// tessera._C: shared pieces of the binding files (one per C++ area).
// Every binding that may wait on communication releases the GIL (py::gil_scoped_release),
// so other Python threads (and autograd's Python hooks in other threads) keep running.
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>  // at::Tensor <-> torch.Tensor casters (same TensorImpl)

#include <string>
#include <tuple>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/comm/communicator.h"
#include "tessera/models/config.h"

namespace tessera::py {

namespace pb = pybind11;

// "sum" | "avg" | "max" | "min" (any case), or a tessera.ReduceOp value.
ReduceOp toReduceOp(const pb::handle& op);

// A checkpoint piece from Python: (name, global shape, offset, local tensor) (checkpoint.cpp).
using PieceArg = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>, at::Tensor>;
std::vector<checkpoint::Piece> toPieces(const std::vector<PieceArg>& in);
// A Llama's fields as tessera.llama.LlamaConfig takes them (models.cpp).
pb::dict configDict(const models::ModelConfig& c);

void bindComm(pb::module_& m);
void bindMesh(pb::module_& m);
void bindDdp(pb::module_& m);
void bindTp(pb::module_& m);
void bindPipeline(pb::module_& m);
void bindFsdp(pb::module_& m);
void bindData(pb::module_& m);
void bindCheckpoint(pb::module_& m);
void bindModels(pb::module_& m);
void bindHf(pb::module_& m);
void bindTrain(pb::module_& m);
void bindMoe(pb::module_& m);

}  // namespace tessera::py
