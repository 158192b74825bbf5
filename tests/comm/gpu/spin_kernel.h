#pragma once
// A deliberately slow kernel for the stream-ordering test: spins for about `ms` milliseconds,
// then fills `data` with `value`. Enqueued on `stream` (a cudaStream_t passed as void*).
namespace tessera::testing {
void launchSpinThenFill(float* data, long long n, float value, double ms, void* stream);
}
