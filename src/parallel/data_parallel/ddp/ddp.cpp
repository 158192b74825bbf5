#include "tessera/parallel/data_parallel/ddp/ddp.h"

#include <ATen/ATen.h>

#include "tessera/common/error.h"
#include "parallel/data_parallel/ddp/param_sync.h"
#include "parallel/data_parallel/ddp/reducer.h"
#include "parallel/data_parallel/ddp/validate.h"

namespace tessera {

DistributedDataParallel::DistributedDataParallel(Named parameters, Named buffers, CommPtr comm, DdpOptions options)
    : buffers_(std::move(buffers)) {
  TESSERA_CHECK(comm, "DistributedDataParallel: no communicator given");
  // Every rank's problems and differences become the same error on every rank (before any
  // rank could go on to a collective the others never reach).
  ddp::agree(*comm, ddp::describeRank(parameters, buffers_, options), comm->scratchOptions());
  std::vector<at::Tensor> state;
  for (auto& p : parameters) state.push_back(p.second);
  for (auto& b : buffers_) state.push_back(b.second);
  ddp::broadcastTensors(*comm, state, 0);
  reducer_ = std::make_unique<Reducer>(std::move(parameters), std::move(comm), options);
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::syncBuffers() {
  if (!reducer_->options().broadcastBuffers || buffers_.empty()) return;
  std::vector<at::Tensor> bufs;
  for (auto& b : buffers_) bufs.push_back(b.second);
  ddp::broadcastTensors(*reducer_->comm(), bufs, 0);
}

void DistributedDataParallel::zeroGrad() { reducer_->zeroGrad(); }
void DistributedDataParallel::reduceGradients() { reducer_->reduceNow(); }

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& d) : d_(d), prev_(d.reducer_->sync()) {
  d_.reducer_->setSync(false);
}

DistributedDataParallel::NoSync::~NoSync() { d_.reducer_->setSync(prev_); }

std::vector<std::vector<std::string>> DistributedDataParallel::bucketLayout() const { return reducer_->layout(); }
const DdpOptions& DistributedDataParallel::options() const { return reducer_->options(); }
const CommPtr& DistributedDataParallel::comm() const { return reducer_->comm(); }

}  // namespace tessera
