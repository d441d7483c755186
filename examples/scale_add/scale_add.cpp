// examples/scale_add/scale_add.cpp: an op defined with opreg's C++ API: a fallback in ATen ops,
// a CPU kernel for the common case that declines the rest, a kernel for the accelerated device
// types, a fake, an explicit backward, and batch-polymorphism for vmap. `python3 -m opreg demo`
// loads this library and calls the op on each device.
// [scale_add.begin]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <opreg/opreg.h>

namespace {

// The reference: x + alpha * y, with broadcasting and type promotion, on any device.
at::Tensor scale_add_reference(const at::Tensor& x, const at::Tensor& y, double alpha) {
  return x + alpha * y;
}

// One pass over memory instead of two; only for same-shape contiguous float32.
at::Tensor scale_add_cpu(const at::Tensor& x, const at::Tensor& y, double alpha) {
  auto out = at::empty_like(x);
  const float* xs = x.const_data_ptr<float>();
  const float* ys = y.const_data_ptr<float>();
  float* outs = out.mutable_data_ptr<float>();
  const auto a = static_cast<float>(alpha);
  at::parallel_for(0, x.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) outs[i] = xs[i] + a * ys[i];
  });
  return out;
}

bool is_same_shape_contiguous_float(const at::Tensor& x, const at::Tensor& y, double) {
  return x.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat && x.sizes() == y.sizes() &&
         x.is_contiguous() && y.is_contiguous();
}

bool is_same_dtype(const at::Tensor& x, const at::Tensor& y, double) {
  return x.scalar_type() == y.scalar_type();
}

// On accelerators, ATen's add with alpha is one fused launch where the reference takes two.
at::Tensor scale_add_fused(const at::Tensor& x, const at::Tensor& y, double alpha) {
  return at::add(x, y, alpha);
}

// Sizes, dtype and strides of the result: ATen's meta function of add applies the same
// broadcasting, promotion and layout rules as the reference.
at::Tensor scale_add_fake(const at::Tensor& x, const at::Tensor& y, double alpha) {
  return at::add(x, y, alpha);
}

// d/dx = 1 and d/dy = alpha, each summed back over the dims broadcasting added.
void scale_add_setup(opreg::AutogradContext& ctx, const std::vector<c10::IValue>& inputs,
                     const std::vector<c10::IValue>& /*outputs*/) {
  ctx.saved_data["x_sizes"] = inputs[0].toTensor().sym_sizes();  // symbolic under dynamic shapes
  ctx.saved_data["y_sizes"] = inputs[1].toTensor().sym_sizes();
  ctx.saved_data["x_dtype"] = inputs[0].toTensor().scalar_type();
  ctx.saved_data["y_dtype"] = inputs[1].toTensor().scalar_type();
  ctx.saved_data["alpha"] = inputs[2];
}

std::vector<at::Tensor> scale_add_backward(opreg::AutogradContext& ctx,
                                           const std::vector<at::Tensor>& grads) {
  const auto& grad = grads[0];
  at::Tensor grad_x, grad_y;
  if (ctx.needs_input_grad(0)) {
    grad_x = at::sum_to(grad, ctx.saved_data["x_sizes"].toSymIntVector())
                 .to(ctx.saved_data["x_dtype"].toScalarType());
  }
  if (ctx.needs_input_grad(1)) {
    grad_y = at::sum_to(grad * ctx.saved_data["alpha"].toDouble(),
                        ctx.saved_data["y_sizes"].toSymIntVector())
                 .to(ctx.saved_data["y_dtype"].toScalarType());
  }
  return {grad_x, grad_y, at::Tensor()};
}

const std::vector<c10::ScalarType> kFloatingTypes = {at::kFloat, at::kDouble, at::kHalf,
                                                     at::kBFloat16};

// [scale_add_declaration.begin]
const auto scale_add =
    opreg::op("opreg_example::scale_add(Tensor x, Tensor y, float alpha=1.0) -> Tensor")
        .fallback(scale_add_reference)
        .kernel(scale_add_cpu,
                opreg::on({"cpu"}).name("cpu_loop").accepts(is_same_shape_contiguous_float))
        .kernel(scale_add_fused, opreg::KernelOptions<>().name("fused").accepts(is_same_dtype))
        .fake(scale_add_fake)
        .backward(scale_add_backward, scale_add_setup)
        .batch_polymorphic()                    // elementwise: extra leading dims are more elements
        .sharding(opreg::Sharding::kPointwise)  // and DTensor may run it on each shard
        .dtypes("x", kFloatingTypes)
        .dtypes("y", kFloatingTypes)
        .define();
// [scale_add_declaration.end]

}  // namespace
// [scale_add.end]
