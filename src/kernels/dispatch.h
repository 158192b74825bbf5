#pragma once
// Internal (kernels/ only): the host side shared by the fused kernels' front ends (norm.cpp,
// rotary.cpp, activations.cpp, cross_entropy.cpp, multi_tensor_adamw.cpp): argument checks that
// name the op and the tensor, the element type of a tensor, and where a CUDA launch goes.
#include <ATen/core/Tensor.h>

#include <string>

#include "kernels/launch.h"

namespace tessera::kernels::detail {

// "[2, 3], bfloat16, cuda:0"
std::string describe(const at::Tensor& t);

// Throws tessera::Error "<op>: <what> must be <requirement> (got <describe(t)>)" unless `ok`.
void require(bool ok, const char* op, const char* what, const char* requirement, const at::Tensor& t);

// t is defined and float32, bfloat16 or float16 (else an error naming op and what).
ElemType elemType(const char* op, const char* what, const at::Tensor& t);

// Whether the front end should take the CUDA kernel: true for CUDA tensors in builds with
// CUDA; false for CPU tensors (the reference); an error naming the op for any other device
// and for CUDA tensors in a build without CUDA.
bool onCuda(const char* op, const at::Tensor& t);

// The caller's current stream on t's device (builds with CUDA only; see onCuda).
Launch launchFor(const at::Tensor& t);

// Throws tessera::Error "<op>: CUDA kernel <kernel> failed on <device> (<shape>): <err>" when
// err is not empty.
void checkLaunched(const std::string& err, const char* op, const char* kernel, const at::Tensor& t);

// Whether the address of t's first element is a multiple of `bytes`.
bool aligned(const at::Tensor& t, int64_t bytes);

}  // namespace tessera::kernels::detail
