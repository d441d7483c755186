// src/ops/fused_add.cpp: opreg::fused_add, x + y, the example every user copies: fallback in
// ATen, an ahead-of-time compiled Triton kernel for the common CUDA case, explicit backward,
// batch-polymorphic under vmap. Built only through opreg's public API.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <opreg/opreg.h>
#include <opreg/ops.h>
#include <opreg/triton.h>

namespace {

// [fused_add.begin]
at::Tensor fused_add_reference(const at::Tensor& x, const at::Tensor& y) { return at::add(x, y); }

// One AOT binary per dtype (python/opreg/kernels/kernels.toml).
const opreg::triton::Kernel& kernel_for(at::ScalarType dtype) {
  static const opreg::triton::Kernel f16("opreg_fused_add_f16"), bf16("opreg_fused_add_bf16"),
      f32("opreg_fused_add_f32"), f64("opreg_fused_add_f64");
  switch (dtype) {
    case at::kHalf:
      return f16;
    case at::kBFloat16:
      return bf16;
    case at::kDouble:
      return f64;
    default:
      return f32;
  }
}

int64_t block_for(at::ScalarType dtype) {
  return dtype == at::kHalf || dtype == at::kBFloat16 ? 2048 : 1024;
}

bool triton_accepts(const at::Tensor& x, const at::Tensor& y) {
  const auto dtype = x.scalar_type();
  return (dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 ||
          dtype == at::kDouble) &&
         y.scalar_type() == dtype && x.sizes() == y.sizes() && x.is_contiguous() &&
         y.is_contiguous() && kernel_for(dtype).available_on(x.get_device());
}

at::Tensor fused_add_triton(const at::Tensor& x, const at::Tensor& y) {
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int64_t n = x.numel();
  kernel_for(x.scalar_type())
      .launch({opreg::triton::cdiv(n, block_for(x.scalar_type()))}, {x, y, out, n});
  return out;
}

// d/dx = d/dy = 1, summed back over broadcast dims, in each input's dtype. The context records
// each input's shape and dtype, so nothing needs saving.
std::vector<at::Tensor> fused_add_backward(opreg::AutogradContext& ctx,
                                           const std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> result(2);
  for (size_t i = 0; i < 2; ++i) {
    if (!ctx.needs_input_grad(i)) continue;
    result[i] = at::sum_to(grads[0], ctx.input_sym_sizes(i));
    if (result[i].scalar_type() != ctx.input_scalar_type(i)) {
      result[i] = result[i].to(ctx.input_scalar_type(i));
    }
  }
  return result;
}

// [fused_add_declaration.begin]
const auto fused_add_op =
    opreg::op("opreg::fused_add(Tensor x, Tensor y) -> Tensor")
        .fallback(fused_add_reference)
        .kernel(fused_add_triton, opreg::on({"cuda"}).name("triton_aot").accepts(triton_accepts))
        .backward(fused_add_backward)
        .batch_polymorphic()
        .sharding(opreg::Sharding::kPointwise)  // elementwise: DTensor runs it on each shard
        .define();
// [fused_add_declaration.end]
// [fused_add.end]

}  // namespace

namespace opreg {

at::Tensor fused_add(const at::Tensor& x, const at::Tensor& y) { return fused_add_op(x, y); }

}  // namespace opreg
