#include "tessera/common/sm_carveout.h"

#include <ATen/Context.h>
#include <torch/version.h>


#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7)
#define TESSERA_ATEN_CARVEOUT 1
#endif

namespace tessera {

bool smCarveoutSupported() {
#ifdef TESSERA_ATEN_CARVEOUT
  return at::globalContext().hasCUDA();
#else
  return false;
#endif
}

SmCarveoutGuard::SmCarveoutGuard(int sms) {
#ifdef TESSERA_ATEN_CARVEOUT
  if (sms <= 0 || !smCarveoutSupported()) return;
  auto& ctx = at::globalContext();
  prevCarveout_ = ctx._SMCarveout_EXPERIMENTAL();
  prevBackend_ = static_cast<int>(ctx.blasPreferredBackend());
  ctx._setSMCarveout_EXPERIMENTAL(sms);
  ctx.setBlasPreferredBackend(at::BlasBackend::Cublaslt);
  active_ = true;
#else
  (void)sms;
#endif
}

SmCarveoutGuard::~SmCarveoutGuard() {
#ifdef TESSERA_ATEN_CARVEOUT
  if (!active_) return;
  auto& ctx = at::globalContext();
  ctx._setSMCarveout_EXPERIMENTAL(prevCarveout_);
  ctx.setBlasPreferredBackend(static_cast<at::BlasBackend>(prevBackend_));
#endif
}

}  // namespace tessera
