// tests/cpp/test_autograd.cpp: explicit backwards, the three policies without one, checked
// arity and shapes, needs_input_grad, and no autograd work when nothing requires grad.
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include "test_util.h"

using opreg_test::error_of;
using opreg_test::impls_of;

namespace {

at::Tensor mul(const at::Tensor& x, const at::Tensor& y) { return x * y; }
at::Tensor mul_kernel(const at::Tensor& x, const at::Tensor& y) { return at::mul(x, y); }

std::vector<at::Tensor> grad_of(const at::Tensor& out, std::vector<at::Tensor> inputs) {
  return torch::autograd::grad({out.sum()}, inputs, {}, std::nullopt, false, true);
}

TEST(Autograd, ExplicitBackwardRunsAfterTheKernel) {
  std::vector<bool> needed;
  auto op = opreg::op("opreg_ad::mul(Tensor x, Tensor y) -> Tensor")
                .fallback(mul)
                .kernel(mul_kernel, opreg::on({"cpu"}))
                .backward(
                    [&](opreg::AutogradContext& ctx, const std::vector<at::Tensor>& grads) {
                      needed = {ctx.needs_input_grad(0), ctx.needs_input_grad(1)};
                      auto saved = ctx.saved_tensors();
                      return std::vector<at::Tensor>{grads[0] * saved[1], at::Tensor()};
                    },
                    [](opreg::AutogradContext& ctx, const std::vector<c10::IValue>& inputs,
                       const std::vector<c10::IValue>&) {
                      ctx.save_for_backward({inputs[0].toTensor(), inputs[1].toTensor()});
                    })
                .define();
  auto x = at::randn({6}).requires_grad_();
  auto y = at::randn({6});
  opreg::TraceScope trace;
  auto out = op(x, y);
  auto grads = grad_of(out, {x});
  EXPECT_EQ(impls_of(trace.records()), (std::vector<std::string>{"kernel:kernel", "backward"}));
  EXPECT_TRUE(at::allclose(grads[0], y));
  EXPECT_EQ(needed, (std::vector<bool>{true, false}));
  EXPECT_EQ(out.grad_fn()->name(), "opreg_ad::mulBackward");
}

std::tuple<at::Tensor, at::Tensor> with_sign(const at::Tensor& x) {
  return {x * 2, at::gt(x, 0).to(at::kLong)};
}

TEST(Autograd, ABackwardGetsOneGradientPerOutputUndefinedForIntegerOutputs) {
  std::vector<bool> defined;
  auto op = opreg::op("opreg_ad::with_sign(Tensor x) -> (Tensor, Tensor)")
                .fallback(with_sign)
                .backward([&](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
                  for (const auto& grad : grads) defined.push_back(grad.defined());
                  return std::vector<at::Tensor>{grads[0] * 2};
                })
                .define();
  auto x = at::randn({3}).requires_grad_();
  auto [value, sign] = op(x);
  EXPECT_FALSE(sign.requires_grad());
  auto grads = grad_of(value, {x});
  EXPECT_TRUE(at::allclose(grads[0], at::full({3}, 2.0)));
  EXPECT_EQ(defined, (std::vector<bool>{true, false}));
}

std::tuple<at::Tensor, at::Tensor> twice_and_thrice(const at::Tensor& x) { return {x * 2, x * 3}; }

// As torch.autograd.Function's ctx: a marked output does not require grad, and backward gets
// zeros for it, or undefined tensors for every output without a gradient once materializing is
// off.
TEST(Autograd, SetupContextMarksOutputsNonDifferentiableAndStopsMaterializingGrads) {
  for (const bool materialize : {true, false}) {
    std::vector<std::string> seen;
    auto op =
        opreg::op("opreg_ad::marked(Tensor x) -> (Tensor, Tensor)")
            .fallback(twice_and_thrice)
            .backward(
                [&](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
                  for (const auto& grad : grads) {
                    seen.push_back(!grad.defined()                 ? "undefined"
                                   : grad.eq(0).all().item<bool>() ? "zeros"
                                                                   : "given");
                  }
                  return std::vector<at::Tensor>{grads[0].defined() ? grads[0] * 2 : at::Tensor()};
                },
                [&](opreg::AutogradContext& ctx, const std::vector<c10::IValue>&,
                    const std::vector<c10::IValue>& outputs) {
                  ctx.mark_non_differentiable({outputs[1].toTensor()});
                  ctx.set_materialize_grads(materialize);
                })
            .replace(true)
            .define();
    auto x = at::randn({3}).requires_grad_();
    auto [twice, thrice] = op(x);
    EXPECT_TRUE(twice.requires_grad());
    EXPECT_FALSE(thrice.requires_grad());
    auto grads = grad_of(twice, {x});
    EXPECT_TRUE(at::allclose(grads[0], at::full({3}, 2.0)));
    EXPECT_EQ(seen, (std::vector<std::string>{"given", materialize ? "zeros" : "undefined"}));
  }
}

TEST(Autograd, MarkingATensorThatIsNoOutputIsRefused) {
  auto op = opreg::op("opreg_ad::marks_input(Tensor x) -> (Tensor, Tensor)")
                .fallback(twice_and_thrice)
                .backward([](opreg::AutogradContext&,
                             const std::vector<at::Tensor>& grads) { return grads; },
                          [](opreg::AutogradContext& ctx, const std::vector<c10::IValue>& inputs,
                             const std::vector<c10::IValue>&) {
                            ctx.mark_non_differentiable({inputs[0].toTensor()});
                          })
                .define();
  EXPECT_EQ(error_of([&] { op(at::randn({3}).requires_grad_()); }),
            "opreg_ad::marks_input: setup_context's ctx.mark_non_differentiable got a tensor (its "
            "argument 0) that is none of the op's outputs; mark outputs only");
}

// The sixth sweep: a backward throwing no std::exception (`throw 42`) terminated the process
// from the autograd engine; std::logic_error lost the op's name.
TEST(Autograd, WhatABackwardOrSetupContextThrowsNamesTheOp) {
  auto op = opreg::op("opreg_ad::throwing(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) { return x * 2; })
                .backward(
                    [](opreg::AutogradContext&,
                       const std::vector<at::Tensor>& grads) -> std::vector<at::Tensor> {
                      if (grads[0].numel() == 1) throw std::logic_error("logic!");
                      throw 42;
                    },
                    [](opreg::AutogradContext&, const std::vector<c10::IValue>& inputs,
                       const std::vector<c10::IValue>&) {
                      if (inputs[0].toTensor().numel() == 3) throw std::runtime_error("setup!");
                    })
                .define();
  auto one = at::ones({1}).requires_grad_();
  EXPECT_EQ(error_of([&] { grad_of(op(one), {one}); }),
            "opreg_ad::throwing: backward threw: logic!");
  auto two = at::ones({2}).requires_grad_();
  EXPECT_EQ(error_of([&] { grad_of(op(two), {two}); }),
            "opreg_ad::throwing: backward threw something that is not a std::exception");
  auto three = at::ones({3}).requires_grad_();
  EXPECT_EQ(error_of([&] { op(three); }), "opreg_ad::throwing: setup_context threw: setup!");
}

TEST(Autograd, NoGradMeansNoNodeAndTheKernelRuns) {
  auto op = opreg::op("opreg_ad::mul_nograd(Tensor x, Tensor y) -> Tensor")
                .fallback(mul)
                .kernel(mul_kernel, opreg::on({"cpu"}))
                .define();
  auto x = at::randn({3}).requires_grad_();
  opreg::TraceScope trace;
  {
    at::NoGradGuard no_grad;
    EXPECT_FALSE(op(x, x).requires_grad());
  }
  EXPECT_FALSE(op(x.detach(), x.detach()).requires_grad());
  EXPECT_EQ(impls_of(trace.records()),
            (std::vector<std::string>{"kernel:kernel", "kernel:kernel"}));
}

TEST(Autograd, FallbackPolicyDifferentiatesTheFallback) {
  auto op = opreg::op("opreg_ad::mul_fallback(Tensor x, Tensor y) -> Tensor")
                .fallback(mul)
                .kernel(mul_kernel, opreg::on({"cpu"}))
                .define();
  auto x = at::randn({4}).requires_grad_();
  auto y = at::randn({4}).requires_grad_();
  opreg::TraceScope trace;
  auto grads = grad_of(op(x, y), {x, y});
  EXPECT_EQ(impls_of(trace.records()), (std::vector<std::string>{"fallback"}));
  EXPECT_TRUE(at::allclose(grads[0], y));
  EXPECT_TRUE(at::allclose(grads[1], x));
}

TEST(Autograd, ErrorPolicyNamesTheOpAndTheFix) {
  auto op = opreg::op("opreg_ad::mul_error(Tensor x, Tensor y) -> Tensor")
                .fallback(mul)
                .autograd(opreg::AutogradPolicy::kError)
                .define();
  auto x = at::randn({4}).requires_grad_();
  auto message = error_of([&] { op(x, x); });
  EXPECT_CONTAINS(message,
                  "opreg_ad::mul_error: an input requires grad, but the op has no backward");
  EXPECT_CONTAINS(message, ".backward(");
  EXPECT_TRUE(at::equal(op(x.detach(), x.detach()), x.detach() * x.detach()));
}

TEST(Autograd, NonePolicyGivesOutputsWithoutGrad) {
  auto op = opreg::op("opreg_ad::mul_none(Tensor x, Tensor y) -> Tensor")
                .fallback(mul)
                .autograd(opreg::AutogradPolicy::kNone)
                .define();
  auto x = at::randn({4}).requires_grad_();
  EXPECT_FALSE(op(x, x).requires_grad());
}

TEST(Autograd, BackwardArityAndShapeAreChecked) {
  auto arity = opreg::op("opreg_ad::arity(Tensor x, Tensor y) -> Tensor")
                   .fallback(mul)
                   .backward([](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
                     return std::vector<at::Tensor>{grads[0]};
                   })
                   .define();
  auto x = at::randn({3}).requires_grad_();
  EXPECT_CONTAINS(error_of([&] { grad_of(arity(x, x), {x}); }),
                  "opreg_ad::arity: backward returned 1 gradients, expected 2");
  auto shape = opreg::op("opreg_ad::shape(Tensor x, Tensor y) -> Tensor")
                   .fallback(mul)
                   .backward([](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
                     return std::vector<at::Tensor>{grads[0].sum(), at::Tensor()};
                   })
                   .define();
  EXPECT_CONTAINS(error_of([&] { grad_of(shape(x, x), {x}); }),
                  "opreg_ad::shape: backward's gradient for input 'x' has shape [], expected [3]");
  // Sweep 32 B-F11: a nested gradient met PyTorch's "NestedTensorImpl doesn't support sizes".
  auto nested = opreg::op("opreg_ad::nested(Tensor x, Tensor y) -> Tensor")
                    .fallback(mul)
                    .backward([](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
                      return std::vector<at::Tensor>{
                          at::_nested_tensor_from_tensor_list({grads[0]}), at::Tensor()};
                    })
                    .define();
  EXPECT_CONTAINS(error_of([&] { grad_of(nested(x, x), {x}); }),
                  "opreg_ad::nested: backward's gradient for input 'x' is a nested tensor");
}

at::Tensor scale(const at::Tensor& x, const at::Tensor& y, double alpha) { return x * y * alpha; }

TEST(Autograd, ContextRecordsEachTensorInputsShapeAndDtype) {
  std::vector<std::vector<int64_t>> sizes;
  std::vector<at::ScalarType> dtypes;
  std::string non_tensor_error, out_of_range_error;
  auto op = opreg::op("opreg_ad::scale(Tensor x, Tensor y, float alpha) -> Tensor")
                .fallback(scale)
                .backward([&](opreg::AutogradContext& ctx, const std::vector<at::Tensor>& grads) {
                  for (size_t i : {0, 1}) {
                    sizes.push_back(c10::asIntArrayRefUnchecked(ctx.input_sym_sizes(i)).vec());
                    dtypes.push_back(ctx.input_scalar_type(i));
                  }
                  non_tensor_error = error_of([&] { ctx.input_sym_sizes(2); });
                  out_of_range_error = error_of([&] { ctx.input_scalar_type(3); });
                  return std::vector<at::Tensor>{at::sum_to(grads[0], ctx.input_sym_sizes(0)),
                                                 at::Tensor(), at::Tensor()};
                })
                .define();
  auto x = at::randn({4, 1}).requires_grad_();
  auto y = at::randn({3}, at::kDouble);
  auto grads = grad_of(op(x, y, 2.0), {x});
  EXPECT_EQ(sizes, (std::vector<std::vector<int64_t>>{{4, 1}, {3}}));
  EXPECT_EQ(dtypes, (std::vector<at::ScalarType>{at::kFloat, at::kDouble}));
  EXPECT_EQ(grads[0].sizes(), x.sizes());
  EXPECT_CONTAINS(non_tensor_error, "input_sym_sizes(2): that input is not a tensor");
  EXPECT_CONTAINS(out_of_range_error, "input_scalar_type(3): the op has 3 inputs");
}

TEST(Autograd, BackwardForAMutatingOpIsRefused) {
  auto message = error_of([] {
    opreg::op("opreg_ad::mutating(Tensor(a!) x) -> ()")
        .fallback([](at::Tensor& x) { x.mul_(2); })
        .backward([](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
          return std::vector<at::Tensor>{grads[0]};
        })
        .define();
  });
  EXPECT_CONTAINS(message, "opreg_ad::mutating: a backward for an op that mutates");
}

TEST(Autograd, MutatingOpBumpsTheVersionCounter) {
  auto op = opreg::op("opreg_ad::double_(Tensor(a!) x) -> ()")
                .fallback([](at::Tensor& x) { x.mul_(2); })
                .define();
  auto x = at::ones({2});
  auto before = x._version();
  op(x);
  EXPECT_GT(x._version(), before);
  EXPECT_TRUE(at::equal(x, at::full({2}, 2.0)));
}

}  // namespace
