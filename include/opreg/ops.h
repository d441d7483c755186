// include/opreg/ops.h: the ops opreg ships (libopreg_ops), callable from C++ through the
// dispatcher. Each is defined only through the public API; see docs/ops/.
#pragma once

#include <ATen/core/Tensor.h>

#include "opreg/export.h"

namespace opreg {

// x + y with torch.add's semantics (broadcasting, type promotion, any layout). Contiguous
// same-shape float16/bfloat16/float32/float64 CUDA tensors run an AOT-compiled Triton kernel.
OPREG_API at::Tensor fused_add(const at::Tensor& x, const at::Tensor& y);

// Philox4x32-10 random numbers, float32 [..., n] for int64 seeds [...]: row r uses the key
// (low 32 bits, high 32 bits) of its seed, Philox call j the counter counter + j (mod 2^64,
// `counter` read as the bits of a uint64), yielding positions 4j..4j+3. Uniform: (u >> 8) * 2^-24.
// Normal: Box-Muller on consecutive pairs. The CUDA kernel and the fallback agree bitwise on
// uniforms; see docs/ops/philox.md.
OPREG_API at::Tensor philox_uniform(const at::Tensor& seeds, int64_t n, int64_t counter = 0);
OPREG_API at::Tensor philox_normal(const at::Tensor& seeds, int64_t n, int64_t counter = 0);

// Low-rank (LoRA) noise without materialising it: individual i's factors are philox_normal
// streams of seeds[i], A_i (rank, k) from `counter` and B_i (d, rank) from counter + ceil4(rank k)
// (EvoX's lora_noise layout). lowrank_delta_output: sigma * (x_i A_i^T) B_i^T for x [..., batch,
// k] and seeds [...], giving [..., batch, d]. lowrank_gradient: sum_i fitness_i B_i A_i /
// (pop sigma) over the last dim of fitness and seeds [..., pop], giving [..., d, k]. x and fitness
// float32 (the CUDA kernels) or float64. See docs/ops/philox.md.
OPREG_API at::Tensor lowrank_delta_output(const at::Tensor& x, const at::Tensor& seeds,
                                          int64_t rank, int64_t out_features, double sigma,
                                          int64_t counter = 0);
OPREG_API at::Tensor lowrank_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                                      int64_t rank, int64_t out_features, int64_t in_features,
                                      double sigma, int64_t counter = 0);

}  // namespace opreg
