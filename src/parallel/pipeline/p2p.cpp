#include "tessera/parallel/pipeline/p2p.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/common/error.h"

namespace tessera::pipeline {

namespace {
// Header layout (int64): [magic, status, dtype, ndim, dims...kMaxHeaderDims]
constexpr int64_t kMagic = 0x7e55e7a9;
constexpr int kHeaderLen = 4 + kMaxHeaderDims;
}  // namespace

TensorMeta TensorMeta::of(const at::Tensor& t) { return {t.sizes().vec(), t.scalar_type()}; }

bool TensorMeta::matches(const at::Tensor& t) const {
  return t.defined() && t.sizes().vec() == shape && t.scalar_type() == dtype;
}

std::string TensorMeta::str() const { return fmt::format("[{}] {}", fmt::join(shape, ", "), dtypeName(dtype)); }

StageP2P::StageP2P(CommPtr group, at::Device device) : group_(std::move(group)), device_(device) {
  TESSERA_CHECK(group_ != nullptr, "pipeline p2p: no communicator");
}

int StageP2P::peerOf(const Transfer& t) const {
  if (t.peer >= 0) return t.peer;
  return t.kind == CommKind::SendForward || t.kind == CommKind::RecvBackward ? next() : prev();
}

void StageP2P::sendHeader(const Header& h, int peer) {
  const auto& s = h.meta.shape;
  TESSERA_CHECK(s.size() <= static_cast<size_t>(kMaxHeaderDims),
                "pipeline p2p: a tensor of {} dims cannot be announced (at most {}): {}", s.size(), kMaxHeaderDims,
                h.meta.str());
  auto cpu = at::zeros({kHeaderLen}, at::kLong);
  auto* p = cpu.data_ptr<int64_t>();
  p[0] = kMagic;
  p[1] = h.status;
  p[2] = static_cast<int64_t>(h.meta.dtype);
  p[3] = static_cast<int64_t>(s.size());
  for (size_t i = 0; i < s.size(); ++i) p[4 + i] = s[i];
  group_->send(cpu.to(device_), peer)->wait();
}

Header StageP2P::recvHeader(int peer) {
  auto buf = at::empty({kHeaderLen}, at::TensorOptions().dtype(at::kLong).device(device_));
  group_->recv(buf, peer)->wait();
  auto cpu = buf.cpu();
  const auto* p = cpu.data_ptr<int64_t>();
  TESSERA_CHECK(p[0] == kMagic && p[3] >= 0 && p[3] <= kMaxHeaderDims,
                "pipeline p2p: rank {} of '{}' received a malformed shape header from rank {} (the stages' "
                "send/receive sequences disagree)",
                rank(), group_->name(), peer);
  Header h;
  h.status = p[1];
  h.meta.dtype = static_cast<at::ScalarType>(p[2]);
  h.meta.shape.assign(p + 4, p + 4 + p[3]);
  return h;
}

std::vector<at::Tensor> StageP2P::exchange(const std::vector<Transfer>& ops) {
  auto p = post(ops);
  if (p.work) p.work->wait();
  return std::move(p.received);
}

StageP2P::Posted StageP2P::post(const std::vector<Transfer>& ops) {
  std::vector<P2POp> batch;
  std::vector<at::Tensor> out(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& t = ops[i];
    if (!isSend(t.kind)) continue;
    TESSERA_CHECK(t.meta.matches(t.tensor),
                  "pipeline p2p: rank {} of '{}' would {} {} as {}, but the shape announced to rank {} is {} "
                  "(a stage's output shape and dtype must be a function of its input's)",
                  rank(), group_->name(), toString(t.kind), t.what, t.tensor.defined() ? TensorMeta::of(t.tensor).str() : "undefined",
                  peerOf(t), t.meta.str());
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& t = ops[i];
    if (isSend(t.kind)) {
      // A detached alias: the caller may free the original's storage right after (the
      // communicator keeps this alias, and so the storage, until the op completes).
      batch.push_back({P2POp::Send, t.tensor.detach().contiguous(), peerOf(t)});
    } else {
      out[i] = at::empty(t.meta.shape, at::TensorOptions().dtype(t.meta.dtype).device(device_));
      batch.push_back({P2POp::Recv, out[i], peerOf(t)});
    }
  }
  Posted p{std::move(out), nullptr};
  if (!batch.empty()) p.work = group_->batchP2P(batch);
  return p;
}

void StageP2P::sendForward(const at::Tensor& act, const TensorMeta& meta) {
  exchange({{CommKind::SendForward, meta, act, "activation"}});
}
at::Tensor StageP2P::recvForward(const TensorMeta& meta) {
  return exchange({{CommKind::RecvForward, meta, {}, "activation"}})[0];
}
void StageP2P::sendBackward(const at::Tensor& grad, const TensorMeta& meta) {
  exchange({{CommKind::SendBackward, meta, grad, "gradient"}});
}
at::Tensor StageP2P::recvBackward(const TensorMeta& meta) {
  return exchange({{CommKind::RecvBackward, meta, {}, "gradient"}})[0];
}
at::Tensor StageP2P::sendForwardRecvBackward(const at::Tensor& act, const TensorMeta& actMeta,
                                             const TensorMeta& gradMeta) {
  return exchange({{CommKind::SendForward, actMeta, act, "activation"}, {CommKind::RecvBackward, gradMeta, {}, "gradient"}})[1];
}
at::Tensor StageP2P::sendBackwardRecvForward(const at::Tensor& grad, const TensorMeta& gradMeta,
                                             const TensorMeta& actMeta) {
  return exchange({{CommKind::SendBackward, gradMeta, grad, "gradient"}, {CommKind::RecvForward, actMeta, {}, "activation"}})[1];
}

}  // namespace tessera::pipeline
