// include/opreg/ops.h: the ops opreg ships (libopreg_ops), callable from C++ through the
// dispatcher. Each is defined only through the public API; see docs/ops/.
#pragma once

#include <ATen/core/Tensor.h>

namespace opreg {

// x + y with torch.add's semantics (broadcasting, type promotion, any layout). Contiguous
// same-shape float16/bfloat16/float32/float64 CUDA tensors run an AOT-compiled Triton kernel.
at::Tensor fused_add(const at::Tensor& x, const at::Tensor& y);

}  // namespace opreg
