#pragma once
// Internal to data_parallel/: what the replicated and sharded wrappers share. Checkpoint pieces of
// parameters and optimizer state as views in the model pieces' boxes, and gradient pieces for the
// global norm weighted by each parameter's replication. Local.
#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/parallel/grad_norm.h"
#include "tessera/parallel/param.h"

namespace tessera::dp {

// The index in `params` of the parameter `local` is a view of (FSDP's parameters share one storage:
// the offset must fall in the parameter's range); else tessera::Error naming `what`.
size_t paramOf(const at::Tensor& local, const std::vector<NamedParam>& params, const std::string& what);

// `local` (a view of `param`) re-aimed at the same elements of `base`, whose element `baseOffset`
// corresponds to param's first element.
at::Tensor sameBox(const at::Tensor& local, const at::Tensor& param, const at::Tensor& base, int64_t baseOffset);

// (model piece, index of its parameter, what: 0 value, 1 exp_avg, 2 exp_avg_sq) -> the tensor.
using ViewFn = std::function<at::Tensor(const checkpoint::Piece&, size_t, int)>;
// Three pieces per model piece: the value and "optim.exp_avg.<name>", "optim.exp_avg_sq.<name>".
std::vector<checkpoint::Piece> trainingPieces(const std::vector<checkpoint::Piece>& modelPieces,
                                              const std::vector<NamedParam>& params, const ViewFn& view);

// Appends `flat` (elements [begin, begin + numel) of p's gradient, flattened) weighted so that each
// element of the model counts once over tp (size `tp`) and the pipeline's copies, split where p's
// replicated rows begin.
void addGradPieces(std::vector<GradPiece>& out, const at::Tensor& flat, int64_t begin, const NamedParam& p, int tp);

// Every part's parameters, in order (a part that shares another's owns none).
std::vector<NamedParam> allParams(const std::vector<std::vector<ModelPart>>& chunks);

}  // namespace tessera::dp
