#include "tessera/nn/blocks.h"

namespace tessera::nn {

at::Tensor BlocksImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (size_t i = 0; i < calls_.size(); ++i) h = around_ ? around_(i, h, calls_[i]) : calls_[i](h);
  return h;
}

}  // namespace tessera::nn
