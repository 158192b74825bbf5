// tessera._C.checkpoint: src/checkpoint's sharded save/load over pieces handed in from Python
// (tessera/checkpoint.py builds the pieces of DDP, FSDP, TP and pipeline models and optimizers).
// A piece is (name, global shape, offset, local tensor); load fills the local tensors in place.
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "tessera/checkpoint/checkpoint.h"

namespace tessera::py {

std::vector<checkpoint::Piece> toPieces(const std::vector<PieceArg>& in) {
  std::vector<checkpoint::Piece> out;
  out.reserve(in.size());
  for (const auto& [name, shape, offset, local] : in) out.push_back({name, shape, offset, local});
  return out;
}

namespace {

pb::dict metaDict(const checkpoint::Metadata& m) {
  pb::dict d;
  d["step"] = m.step;
  d["world"] = m.world;
  d["extra"] = m.extra;
  d["shapes"] = m.shapes;
  return d;
}

}  // namespace

void bindCheckpoint(pb::module_& m) {
  auto c = m.def_submodule("checkpoint", "src/checkpoint's sharded checkpoints (see tessera.checkpoint)");
  c.def(
      "save",
      [](const std::string& dir, const std::vector<PieceArg>& pieces, Communicator& comm, int64_t step,
         const std::map<std::string, std::string>& extra) {
        auto ps = toPieces(pieces);
        pb::gil_scoped_release nogil;
        checkpoint::save(dir, ps, comm, step, extra);
      },
      pb::arg("dir"), pb::arg("pieces"), pb::arg("comm"), pb::arg("step"), pb::arg("extra"),
      "Collective over comm: [(name, global shape, offset, tensor)] into <dir> (replicated boxes written once)");
  c.def(
      "load",
      [](const std::string& dir, const std::vector<PieceArg>& pieces) {
        auto ps = toPieces(pieces);
        checkpoint::Metadata meta;
        {
          pb::gil_scoped_release nogil;
          meta = checkpoint::load(dir, ps);
        }
        return metaDict(meta);
      },
      pb::arg("dir"), pb::arg("pieces"),
      "Fills each piece's tensor in place from whatever saved pieces overlap its box; returns the metadata");
  c.def(
      "read_metadata", [](const std::string& dir) { return metaDict(checkpoint::readMetadata(dir)); },
      pb::arg("dir"));
  c.def(
      "locate", [](const std::string& dir) { return checkpoint::locate(dir); }, pb::arg("dir"),
      "The directory holding the checkpoint to read for dir (the newest complete step-<N> of a run's "
      "directory, dir itself, or dir.old), None when there is none; an error when dir holds checkpoint files "
      "but nothing complete");
}

}  // namespace tessera::py
