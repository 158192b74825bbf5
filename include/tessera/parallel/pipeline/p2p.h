#pragma once
// Typed point-to-point between neighbouring pipeline stages over the pp group: activations go to
// next() = (rank + 1) % size, gradients to prev(). Every exchange is one batchP2P (one NCCL group on
// GPUs); both sides must issue matching exchanges. exchange() waits for its ops (CUDA: the current
// stream waits, see work.h); post() returns the Work, to wait just before a received tensor is used.
// Until that wait a received buffer must not be read nor a sent tensor written (the Work keeps both
// alive). Received buffers are allocated on the given device.
// Shapes: a receive must know the shape and dtype of what arrives; sendHeader/recvHeader exchange
// them when they may have changed, and between headers every transfer uses the announced
// TensorMeta. A tensor to send that does not match it is a tessera::Error naming both shapes,
// raised on the sending rank before anything is sent.
// Not thread-safe; all calls come from the thread driving the stage. docs/design/pipeline.md.
#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::pipeline {

struct TensorMeta {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;

  static TensorMeta of(const at::Tensor& t);
  bool matches(const at::Tensor& t) const;
  bool operator==(const TensorMeta& o) const { return shape == o.shape && dtype == o.dtype; }
  bool operator!=(const TensorMeta& o) const { return !(*this == o); }
  std::string str() const;  // "[4, 8] float32"
};

// Most dims a header carries.
constexpr int kMaxHeaderDims = 8;

struct Header {
  int64_t status = 0;  // 0: ok; otherwise an error code agreed by the two sides (the executor
                       // sends the failing stage + 1)
  TensorMeta meta;
};

// One transfer of an exchange. For sends `tensor` is what to send (checked against `meta`);
// for receives `meta` says what to allocate.
struct Transfer {
  CommKind kind;
  TensorMeta meta;
  at::Tensor tensor;
  std::string what;  // for errors: "activation of micro-batch 3 (stage 1)"
  int peer = -1;     // the other rank; -1: by kind (next() for SendForward / RecvBackward, else prev())
};

class StageP2P {
 public:
  StageP2P(CommPtr group, at::Device device);

  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  int next() const { return (rank() + 1) % size(); }
  int prev() const { return (rank() + size() - 1) % size(); }
  const CommPtr& group() const { return group_; }
  const at::Device& device() const { return device_; }

  // Blocking header exchange with one peer. Throws when meta has more than kMaxHeaderDims dims.
  void sendHeader(const Header& h, int peer);
  Header recvHeader(int peer);

  // One batch: sends and receives issued together, waited together. Returns, in order, the
  // received tensors (undefined at send positions). Sends are checked against their meta
  // first (nothing is sent when one fails). Tensors sent are made contiguous (a copy only
  // when they are not).
  std::vector<at::Tensor> exchange(const std::vector<Transfer>& ops);
  struct Posted {
    std::vector<at::Tensor> received;  // as exchange() returns them, filled once `work` is done
    WorkPtr work;                      // null when `ops` was empty
  };
  Posted post(const std::vector<Transfer>& ops);

  // Typed forms (Megatron's p2p_communication names).
  void sendForward(const at::Tensor& act, const TensorMeta& meta);
  at::Tensor recvForward(const TensorMeta& meta);
  void sendBackward(const at::Tensor& grad, const TensorMeta& meta);
  at::Tensor recvBackward(const TensorMeta& meta);
  // Send this stage's output to next(), receive the gradient of an earlier output from next().
  at::Tensor sendForwardRecvBackward(const at::Tensor& act, const TensorMeta& actMeta, const TensorMeta& gradMeta);
  // Send an input gradient to prev(), receive the next input from prev().
  at::Tensor sendBackwardRecvForward(const at::Tensor& grad, const TensorMeta& gradMeta, const TensorMeta& actMeta);

 private:
  int peerOf(const Transfer& t) const;  // t.peer, else by its kind
  CommPtr group_;
  at::Device device_;
};

}  // namespace tessera::pipeline
