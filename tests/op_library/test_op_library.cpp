// tests/op_library/test_op_library.cpp: C++-defined ops that the Python tests load (opreg_test::*),
// each covering one piece of the builder: kernels with declines, mutation, a fallback that cannot
// run on meta, device types, autograd (backwards and policies) and vmap (rules, loop, randomness).
#include <ATen/ATen.h>
#include <opreg/opreg.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <thread>

namespace {

at::Tensor affine_reference(const at::Tensor& x, double scale, double shift) {
  return x * scale + shift;
}
at::Tensor affine_cpu(const at::Tensor& x, double scale, double shift) {
  return at::add(at::mul(x, scale), shift);
}

const auto affine =
    opreg::op("opreg_test::affine(Tensor x, float scale, float shift) -> Tensor")
        .fallback(affine_reference)
        .kernel(affine_cpu,
                opreg::on({"cpu"}).name("cpu").accepts(
                    [](const at::Tensor& x, double, double) { return x.is_contiguous(); }))
        .define();

void scale_(at::Tensor& x, double factor) { x.mul_(factor); }
const auto scale_inplace =
    opreg::op("opreg_test::scale_(Tensor(a!) x, float factor) -> ()").fallback(scale_).define();

at::Tensor normalize_by_max(const at::Tensor& x) { return x / x.abs().max().item<double>(); }
const auto needs_data = opreg::op("opreg_test::normalize_by_max(Tensor x) -> Tensor")
                            .fallback(normalize_by_max)
                            .define();

// A fallback whose own argument check fails the same way with or without vmap (23rd sweep, B-F7).
at::Tensor checked_sum(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.numel() > 0, "x must not be empty");
  return x.sum();
}
const auto nonempty_sum =
    opreg::op("opreg_test::nonempty_sum(Tensor x) -> Tensor").fallback(checked_sum).define();

at::Tensor identity(const at::Tensor& x) { return x.clone(); }
const auto npu_only = opreg::op("opreg_test::npu_only(Tensor x) -> Tensor")
                          .fallback(identity)
                          .kernel(identity, opreg::on({"npu"}).name("npu"))
                          .define();

const auto follows_registry = opreg::op("opreg_test::follows_registry(Tensor x) -> Tensor")
                                  .fallback(identity)
                                  .kernel(identity, opreg::KernelOptions<>().name("accel"))
                                  .define();

// ---- autograd ----------------------------------------------------------------------------------

// square's backward calls square_backward, an opreg op with its own fallback and kernels: the
// backward is device-specific within one op (the CUDA kernel on CUDA, the fallback on CPU).
at::Tensor square_backward_reference(const at::Tensor& grad, const at::Tensor& x) {
  return 2 * x * grad;
}
at::Tensor square_backward_fused(const at::Tensor& grad, const at::Tensor& x) {
  return at::mul(x, grad).mul_(2);
}
const auto square_backward =
    opreg::op("opreg_test::square_backward(Tensor grad, Tensor x) -> Tensor")
        .fallback(square_backward_reference)
        .kernel(square_backward_fused, opreg::on({"cuda"}).name("cuda"))
        .define();

at::Tensor square_reference(const at::Tensor& x) { return x * x; }
const auto square =
    opreg::op("opreg_test::square(Tensor x) -> Tensor")
        .fallback(square_reference)
        .kernel(square_reference, opreg::on({"cuda"}).name("cuda"))
        .backward(
            [](opreg::AutogradContext& ctx, const std::vector<at::Tensor>& grads) {
              auto x = ctx.saved_tensors()[0];
              return std::vector<at::Tensor>{square_backward(grads[0], x)};
            },
            [](opreg::AutogradContext& ctx, const std::vector<c10::IValue>& inputs,
               const std::vector<c10::IValue>&) { ctx.save_for_backward({inputs[0].toTensor()}); })
        .define();

// exp saves its output, which must not keep itself alive through its own grad_fn.
const auto exp_op = opreg::op("opreg_test::exp(Tensor x) -> Tensor")
                        .fallback([](const at::Tensor& x) { return x.exp(); })
                        .backward(
                            [](opreg::AutogradContext& ctx, const std::vector<at::Tensor>& grads) {
                              return std::vector<at::Tensor>{grads[0] * ctx.saved_tensors()[0]};
                            },
                            [](opreg::AutogradContext& ctx, const std::vector<c10::IValue>&,
                               const std::vector<c10::IValue>& outputs) {
                              ctx.save_for_backward({outputs[0].toTensor()});
                            })
                        .define();

// Its fallback's error holds a byte that is not UTF-8 (Python raised UnicodeDecodeError for it):
// a std::runtime_error, or for two elements a c10::ValueError (sweep 32 B-F13); for three, a NUL
// (Python's message stopped there, sweep 35 B-F2).
const auto throws_bytes = opreg::op("opreg_test::throws_bytes(Tensor x) -> Tensor")
                              .fallback([](const at::Tensor& x) -> at::Tensor {
                                TORCH_CHECK_VALUE(x.numel() != 2, "bad \xfe value");
                                TORCH_CHECK(x.numel() != 3, std::string("nul\0after", 9));
                                throw std::runtime_error("bad \xff byte");
                              })
                              .define();

const auto refuses_grad = opreg::op("opreg_test::refuses_grad(Tensor x) -> Tensor")
                              .fallback([](const at::Tensor& x) { return x.sin(); })
                              .autograd(opreg::AutogradPolicy::kError)
                              .define();

const auto wrong_backward_arity =
    opreg::op("opreg_test::wrong_backward_arity(Tensor x, Tensor y) -> Tensor")
        .fallback([](const at::Tensor& x, const at::Tensor& y) { return x * y; })
        .backward([](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
          return std::vector<at::Tensor>{grads[0]};
        })
        .define();

const auto wrong_backward_shape =
    opreg::op("opreg_test::wrong_backward_shape(Tensor x) -> Tensor")
        .fallback([](const at::Tensor& x) { return x * 2; })
        .backward([](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
          return std::vector<at::Tensor>{grads[0].sum()};
        })
        .define();

// ---- vmap --------------------------------------------------------------------------------------

// Sums the last dim. The rule moves the batch dim to the front and calls the op itself, which
// sums the last dim of every example at once (and reaches the rule again for an inner vmap).
const auto rowsum =
    opreg::op("opreg_test::rowsum(Tensor x) -> Tensor")
        .fallback([](const at::Tensor& x) { return x.sum(-1); })
        .vmap([](const opreg::VmapInfo&, const std::vector<std::optional<int64_t>>& in_dims,
                 const std::vector<c10::IValue>& args) {
          auto x = args[0].toTensor().movedim(*in_dims[0], 0);
          auto op = opreg::OpHandle<at::Tensor(const at::Tensor&)>("opreg_test::rowsum");
          return opreg::VmapResult{{op(x)}, {0}};
        })
        .define();

// x + row, with a rule that gives an unbatched row the batch from info.batch_size (symbolic under
// tracing with a dynamic batch, so the traced graph keeps it general).
const auto add_row =
    opreg::op("opreg_test::add_row(Tensor x, Tensor row) -> Tensor")
        .fallback([](const at::Tensor& x, const at::Tensor& row) { return x + row; })
        .vmap([](const opreg::VmapInfo& info, const std::vector<std::optional<int64_t>>& in_dims,
                 const std::vector<c10::IValue>& args) {
          auto batched = [&](size_t i) {
            const at::Tensor value = args[i].toTensor();
            if (in_dims[i]) return value.movedim(*in_dims[i], 0);
            std::vector<c10::SymInt> sizes{info.batch_size};
            for (const auto& size : value.sym_sizes()) sizes.push_back(size);
            return value.unsqueeze(0).expand_symint(sizes);
          };
          auto row = batched(1);
          return opreg::VmapResult{{batched(0) + row.unsqueeze(1)}, {0}};
        })
        .define();

// Its output's size is data-dependent, and the fallback reads a value (.item()): under vmap only
// the per-example loop can run it.
const auto normalize_by_max_looped =
    opreg::op("opreg_test::normalize_by_max_looped(Tensor x) -> Tensor")
        .fallback(normalize_by_max)
        .vmap_per_example_loop()
        .define();

// x + uniform noise: random, batch-polymorphic, no gradient.
const auto noisy = opreg::op("opreg_test::noisy(Tensor x) -> Tensor")
                       .fallback([](const at::Tensor& x) { return x + at::rand_like(x); })
                       .random()
                       .batch_polymorphic()
                       .autograd(opreg::AutogradPolicy::kNone)
                       .define();

const auto bad_vmap_rule =
    opreg::op("opreg_test::bad_vmap_rule(Tensor x) -> Tensor")
        .fallback([](const at::Tensor& x) { return x * 2; })
        .vmap([](const opreg::VmapInfo&, const std::vector<std::optional<int64_t>>&,
                 const std::vector<c10::IValue>& args) {
          return opreg::VmapResult{{args[0], args[0]}, {0, 0}};
        })
        .define();

// Sweep 37 B-F5: an undefined tensor from a rule was said to have "0 entries along its batch dim".
const auto undefined_vmap_rule =
    opreg::op("opreg_test::undefined_vmap_rule(Tensor x) -> Tensor")
        .fallback([](const at::Tensor& x) { return x * 2; })
        .vmap(
            [](const opreg::VmapInfo&, const std::vector<std::optional<int64_t>>&,
               const std::vector<c10::IValue>&) { return opreg::VmapResult{{at::Tensor()}, {0}}; })
        .define();

// Sweep 48 B-V5: one with out_dim None came out of torch.vmap as None for a Tensor output.
const auto undefined_unbatched_vmap_rule =
    opreg::op("opreg_test::undefined_unbatched_vmap_rule(Tensor x) -> Tensor")
        .fallback([](const at::Tensor& x) { return x * 2; })
        .vmap([](const opreg::VmapInfo&, const std::vector<std::optional<int64_t>>&,
                 const std::vector<c10::IValue>&) {
          return opreg::VmapResult{{at::Tensor()}, {std::nullopt}};
        })
        .define();

// Ops a call may give no tensor (Note [An op's rule for FakeTensorMode]).
const auto arange_cpp = opreg::op("opreg_test::arange(int n) -> Tensor")
                            .fallback([](int64_t n) { return at::arange(n, at::kFloat); })
                            .define();
const auto arange_faked =
    opreg::op("opreg_test::arange_faked(int n) -> Tensor")
        .fallback([](int64_t n) { return at::arange(n, at::kFloat); })
        .fake([](int64_t n) { return at::empty({n}, at::TensorOptions(at::kMeta)); })
        .define();
const auto sum_or_zeros = opreg::op("opreg_test::sum_or_zeros(Tensor[] xs, int n) -> Tensor")
                              .fallback([](const std::vector<at::Tensor>& xs, int64_t n) {
                                return xs.empty() ? at::zeros({n}) : at::stack(xs).sum(0);
                              })
                              .define();

// The hooks below serve the Python tests through ctypes: 0 when what they do succeeded, 1 (with
// the message on stderr) when it was refused.
template <class Action>
int status_of(Action action) {
  try {
    action();
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 1;
  }
}

std::atomic<int> replaces_ended{0};
std::atomic<bool> stop_replacing{false};
std::atomic<int64_t> replaces_made{0};
std::thread toggler;  // joined by opreg_test_stop_replacing

}  // namespace

// opreg::undefine (the Python front has no undefine).
extern "C" __attribute__((visibility("default"))) int opreg_test_undefine(const char* name) {
  return status_of([&] { opreg::undefine(name); });
}

// Replaces opreg_test::flip `times` times, its schema taking an int k every other time: a schema
// change made from a thread without the GIL (ctypes releases it).
extern "C" __attribute__((visibility("default"))) int opreg_test_flip_schema(int times) {
  return status_of([&] {
    for (int i = 0; i < times; ++i) {
      if (i % 2 == 0) {
        opreg::op("opreg_test::flip(Tensor x, int k) -> Tensor")
            .fallback([](const at::Tensor& x, int64_t k) { return x + k; })
            .replace()
            .define();
      } else {
        opreg::op("opreg_test::flip(Tensor x) -> Tensor")
            .fallback([](const at::Tensor& x) { return x + 1; })
            .replace()
            .define();
      }
    }
  });
}

// Replaces `name` (an op of schema (int n) -> Tensor) from C++, outside a library load, as a C++
// extension may at any time: its fallback gives n + 1 numbers.
extern "C" __attribute__((visibility("default"))) int opreg_test_replace_arange(const char* name) {
  return status_of([&] {
    opreg::op(std::string(name) + "(int n) -> Tensor")
        .fallback([](int64_t n) { return at::arange(n + 1, at::kFloat); })
        .replace()
        .define();
  });
}

// Replaces `name` (an op of schema (Tensor x) -> Tensor) with x + 4 on the calling thread;
// opreg_test_wait_for_replace(ms) waits up to `ms` milliseconds for such a replace to end (1: one
// did) without releasing the GIL through ctypes.PyDLL: a Python thread that released it
// (ctypes.CDLL) replaced while another held it (sweep 39 B-F2).
extern "C" __attribute__((visibility("default"))) int opreg_test_replace_here(const char* name) {
  const int status = status_of([&] {
    opreg::op(std::string(name) + "(Tensor x) -> Tensor")
        .fallback([](const at::Tensor& x) { return x + 4; })
        .replace()
        .define();
  });
  replaces_ended.fetch_add(1);
  return status;
}

extern "C" __attribute__((visibility("default"))) int opreg_test_wait_for_replace(int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (replaces_ended.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return replaces_ended.load() > 0 ? 1 : 0;
}

// The same replace on a thread of C++'s own, waited for: through ctypes.PyDLL the caller holds
// the GIL meanwhile (sweep 38 B-F1: freeing a replaced Python definition waited for the GIL
// forever).
extern "C" __attribute__((visibility("default"))) int opreg_test_replace_on_a_thread(
    const char* name) {
  int status = 0;
  std::thread replacer([&] { status = opreg_test_replace_here(name); });
  replacer.join();
  return status;
}

// Replaces `name` (an op of schema (Tensor x) -> Tensor, x * 3) on a thread of C++'s own again and
// again until opreg_test_stop_replacing (which returns how many times): the same schema text,
// with the cudagraph_unsafe tag every other time. Registered anew without the GIL, the schema was
// freed under Python's callers (sweep 39 B-F1).
extern "C" __attribute__((visibility("default"))) void opreg_test_start_toggling_tags(
    const char* name) {
  stop_replacing = false;
  toggler = std::thread([qualified = std::string(name)] {
    for (int64_t i = 0; !stop_replacing; ++i) {
      opreg::op(qualified + "(Tensor x) -> Tensor")
          .fallback([](const at::Tensor& x) { return x * 3; })
          .cuda_graph_unsafe(i % 2 == 1)
          .replace()
          .define();
      replaces_made.fetch_add(1);
    }
  });
}

// Defines opreg_test::nesting, whose cpu kernel's factory replaces `name` (an op of schema
// (Tensor x) -> Tensor) with x * 3 and the cudagraph_unsafe tag `tagged`: a definition made
// inside another, which cannot wait for the GIL (sweep 40 B-F1).
extern "C" __attribute__((visibility("default"))) int opreg_test_replace_inside_a_definition(
    const char* name, int tagged) {
  return status_of([&] {
    opreg::OpBuilder nesting("opreg_test::nesting(Tensor x) -> Tensor");
    auto plus_one = [](const at::Tensor& x) { return x + 1; };
    nesting.fallback(opreg::KernelFactory{[plus_one](const opreg::KernelContext&) {
      return c10::KernelFunction::makeFromUnboxedLambda(plus_one);
    }});
    nesting.kernel(opreg::KernelFactory{[plus_one, qualified = std::string(name),
                                         tagged](const opreg::KernelContext&) {
                     opreg::op(qualified + "(Tensor x) -> Tensor")
                         .fallback([](const at::Tensor& x) { return x * 3; })
                         .cuda_graph_unsafe(tagged != 0)
                         .replace()
                         .define();
                     return c10::KernelFunction::makeFromUnboxedLambda(plus_one);
                   }},
                   "replacing", std::vector<std::string>{"cpu"});
    nesting.replace();
    std::move(nesting).define();
  });
}

// Defines opreg_test::calling_in_factory, whose cpu kernel's factory calls `name` (an op of
// schema (Tensor x) -> Tensor): from a thread without the GIL, a Python op's pieces waited for it
// under opreg's lock, which Python threads take holding it (sweep 41 B-F1).
extern "C" __attribute__((visibility("default"))) int opreg_test_call_inside_a_definition(
    const char* name) {
  return status_of([&] {
    opreg::OpBuilder calling("opreg_test::calling_in_factory(Tensor x) -> Tensor");
    auto plus_one = [](const at::Tensor& x) { return x + 1; };
    calling.fallback(opreg::KernelFactory{[plus_one](const opreg::KernelContext&) {
      return c10::KernelFunction::makeFromUnboxedLambda(plus_one);
    }});
    calling.kernel(opreg::KernelFactory{[plus_one, qualified = std::string(name)](
                                            const opreg::KernelContext&) {
                     const opreg::OpHandle<at::Tensor(const at::Tensor&)> python_op(qualified);
                     python_op(at::ones({2}));
                     return c10::KernelFunction::makeFromUnboxedLambda(plus_one);
                   }},
                   "calling", std::vector<std::string>{"cpu"});
    calling.replace();
    std::move(calling).define();
  });
}

// Calls `name` (an op of schema (Tensor x, str text) -> Tensor) with `text` as its str: a C++
// caller's bytes may be no UTF-8 text, which Python cannot read (sweep 45 B-N29).
extern "C" __attribute__((visibility("default"))) int opreg_test_call_with_text(const char* name,
                                                                                const char* text) {
  return status_of([&] {
    const opreg::OpHandle<at::Tensor(const at::Tensor&, c10::string_view)> op(name);
    op(at::ones({1}), c10::string_view(text));
  });
}

extern "C" __attribute__((visibility("default"))) int64_t opreg_test_stop_replacing() {
  stop_replacing = true;
  if (toggler.joinable()) toggler.join();
  return replaces_made.exchange(0);
}
