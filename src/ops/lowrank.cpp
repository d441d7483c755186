// src/ops/lowrank.cpp: opreg::lowrank_delta_output and opreg::lowrank_gradient, EvoX's low-rank
// (LoRA) noise without materialising it. Individual i's factors are philox_normal streams of its
// seed: A_i (rank, k) from `counter`, B_i (d, rank) from counter + ceil4(rank * k), the layout of
// EvoX's lora_noise helpers. The fallback draws A and B with opreg::philox_normal and multiplies as
// those helpers do; the AOT Triton kernels generate the same values in registers and never store
// them. See docs/ops/philox.md ("Low-rank noise").
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/safe_numerics.h>
#include <opreg/opreg.h>
#include <opreg/ops.h>
#include <opreg/triton.h>

namespace {

// The kernels' tiles: BLOCK_B (delta output) and BLOCK_D, BLOCK_K (gradient) in
// python/opreg/kernels/kernels.toml; one kernel per rank 1, 2, 4, ..., kMaxKernelRank.
constexpr int64_t kDeltaBatchBlock = 16, kGradientBlock = 64, kMaxKernelRank = 16;
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1, kMaxGridYZ = 65535;

struct Factors {
  int64_t a_count, b_count;  // values of A (rank * k) and B (d * rank) per individual
  int64_t b_counter;         // counter + ceil4(a_count), mod 2^64
};

// Checks rank, k and d, and places B's stream after A's as EvoX does.
Factors factors(const char* op, int64_t rank, int64_t in_features, int64_t out_features,
                int64_t counter) {
  TORCH_CHECK_VALUE(rank >= 1, op, ": argument 'rank' must be >= 1, got ", rank);
  TORCH_CHECK_VALUE(out_features >= 0, op, ": argument 'out_features' must be >= 0, got ",
                    out_features);
  TORCH_CHECK_VALUE(in_features >= 0, op, ": in_features must be >= 0, got ", in_features);
  Factors f{};
  const bool overflows = c10::mul_overflows(rank, in_features, &f.a_count) ||
                         c10::mul_overflows(rank, out_features, &f.b_count) ||
                         f.a_count > INT64_MAX - 3;
  TORCH_CHECK_VALUE(!overflows, op, ": rank ", rank, " times in_features ", in_features,
                    " or out_features ", out_features, " is too large");
  const auto calls = static_cast<uint64_t>((f.a_count + 3) / 4 * 4);
  f.b_counter = static_cast<int64_t>(static_cast<uint64_t>(counter) + calls);
  return f;
}

std::vector<int64_t> with(c10::IntArrayRef lead, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> shape(lead.begin(), lead.end());
  shape.insert(shape.end(), tail);
  return shape;
}

// x is [..., batch, k] with seeds [...]: one individual per seed.
void check_delta_shapes(const at::Tensor& x, const at::Tensor& seeds) {
  TORCH_CHECK_VALUE(x.dim() >= 2, "opreg::lowrank_delta_output: argument 'x' must be [..., batch, ",
                    "in_features], got ", x.dim(), " dimension(s)");
  TORCH_CHECK_VALUE(x.sizes().slice(0, x.dim() - 2) == seeds.sizes(),
                    "opreg::lowrank_delta_output: argument 'x' of shape ", x.sizes(),
                    " must be seeds.shape + (batch, in_features) for 'seeds' of shape ",
                    seeds.sizes());
}

// fitness and seeds are [..., pop]: the gradient contracts the last dim.
int64_t check_gradient_shapes(const at::Tensor& fitness, const at::Tensor& seeds, double sigma) {
  const char* op = "opreg::lowrank_gradient";
  TORCH_CHECK_VALUE(seeds.dim() >= 1, op, ": argument 'seeds' must be [..., pop], got a scalar");
  TORCH_CHECK_VALUE(fitness.sizes() == seeds.sizes(), op, ": argument 'fitness' of shape ",
                    fitness.sizes(), " must have the shape of 'seeds', ", seeds.sizes());
  const int64_t pop = seeds.size(-1);
  TORCH_CHECK_VALUE(pop >= 1, op, ": needs at least one individual, got pop = 0");
  TORCH_CHECK_VALUE(sigma != 0, op, ": argument 'sigma' must not be 0 (the estimate divides by ",
                    "pop * sigma)");
  return pop;
}

// The gradient [..., d, k] must fit in memory's addresses, checked before the factors are drawn
// (they alone may take gigabytes first).
void check_gradient_size(const at::Tensor& fitness, const at::Tensor& seeds, int64_t out_features,
                         int64_t in_features) {
  int64_t bytes = static_cast<int64_t>(fitness.element_size());
  bool overflows = c10::mul_overflows(bytes, out_features, &bytes) ||
                   c10::mul_overflows(bytes, in_features, &bytes);
  for (int64_t i = 0; i + 1 < seeds.dim(); ++i) {
    overflows = overflows || c10::mul_overflows(bytes, seeds.size(i), &bytes);
  }
  TORCH_CHECK_VALUE(!overflows, "opreg::lowrank_gradient: the gradient of out_features ",
                    out_features, " times in_features ", in_features, " (for 'seeds' of shape ",
                    seeds.sizes(), ") is too large to hold in memory");
}

// The factors, materialised: A [..., rank, k] and B [..., d, rank] in `dtype`.
std::pair<at::Tensor, at::Tensor> draw(const at::Tensor& seeds, int64_t rank, int64_t k, int64_t d,
                                       int64_t counter, const Factors& f, at::ScalarType dtype) {
  auto a = opreg::philox_normal(seeds, f.a_count, counter).view(with(seeds.sizes(), {rank, k}));
  auto b = opreg::philox_normal(seeds, f.b_count, f.b_counter).view(with(seeds.sizes(), {d, rank}));
  return {a.to(dtype), b.to(dtype)};
}

at::Tensor delta_output_reference(const at::Tensor& x, const at::Tensor& seeds, int64_t rank,
                                  int64_t out_features, double sigma, int64_t counter) {
  check_delta_shapes(x, seeds);
  const int64_t k = x.size(-1);
  const auto f = factors("opreg::lowrank_delta_output", rank, k, out_features, counter);
  auto [a, b] = draw(seeds, rank, k, out_features, counter, f, x.scalar_type());
  return at::matmul(at::matmul(x, a.transpose(-1, -2)), b.transpose(-1, -2)) * sigma;
}

at::Tensor gradient_reference(const at::Tensor& fitness, const at::Tensor& seeds, int64_t rank,
                              int64_t out_features, int64_t in_features, double sigma,
                              int64_t counter) {
  const int64_t pop = check_gradient_shapes(fitness, seeds, sigma);
  const auto f = factors("opreg::lowrank_gradient", rank, in_features, out_features, counter);
  check_gradient_size(fitness, seeds, out_features, in_features);
  auto [a, b] = draw(seeds, rank, in_features, out_features, counter, f, fitness.scalar_type());
  return at::einsum("...i,...ijk,...ikl->...jl", {fitness, b, a}) /
         (static_cast<double>(pop) * sigma);
}

at::Tensor delta_output_fake(const at::Tensor& x, const at::Tensor& seeds, int64_t rank,
                             int64_t out_features, double, int64_t counter) {
  check_delta_shapes(x, seeds);
  // k may be symbolic under tracing: then only rank and out_features are checked here.
  const int64_t k = x.sym_size(-1).maybe_as_int().value_or(0);
  factors("opreg::lowrank_delta_output", rank, k, out_features, counter);
  auto shape = x.sym_sizes().vec();
  shape.back() = out_features;
  return at::empty_symint(shape, x.options());
}

at::Tensor gradient_fake(const at::Tensor& fitness, const at::Tensor& seeds, int64_t rank,
                         int64_t out_features, int64_t in_features, double sigma, int64_t counter) {
  check_gradient_shapes(fitness, seeds, sigma);
  factors("opreg::lowrank_gradient", rank, in_features, out_features, counter);
  auto shape = seeds.sym_sizes().vec();
  shape.back() = out_features;
  shape.emplace_back(in_features);
  return at::empty_symint(shape, fitness.options());
}

enum class Family { kDeltaOutput, kGradient };

// The kernel for this rank: one per power of two up to kMaxKernelRank, nullptr for others.
const opreg::triton::Kernel* kernel_for(Family family, int64_t rank) {
  using Kernels = std::vector<std::unique_ptr<opreg::triton::Kernel>>;
  static const auto make = [](const std::string& name) {
    Kernels kernels;
    for (int64_t r = 1; r <= kMaxKernelRank; r *= 2) {
      kernels.push_back(std::make_unique<opreg::triton::Kernel>(name + "_r" + std::to_string(r)));
    }
    return kernels;
  };
  static const Kernels delta_output = make("opreg_lowrank_delta_output");
  static const Kernels gradient = make("opreg_lowrank_gradient");
  if (rank < 1 || rank > kMaxKernelRank || (rank & (rank - 1)) != 0) return nullptr;
  const auto& kernels = family == Family::kDeltaOutput ? delta_output : gradient;
  return kernels[__builtin_ctzll(static_cast<uint64_t>(rank))].get();
}

// What both kernels need: a binary for this GPU and this rank, in_features a positive multiple
// of 4 (every row of A starts a Philox call), the factors' index arithmetic within int32.
bool kernel_fits(Family family, const at::Tensor& seeds, int64_t rank, int64_t k, int64_t d) {
  const auto* kernel = kernel_for(family, rank);
  if (kernel == nullptr || k <= 0 || k % 4 != 0 || d <= 0) return false;
  if (k > INT32_MAX / rank || d > INT32_MAX / rank) return false;
  return kernel->available_on(seeds.get_device());
}

at::Tensor delta_output_triton(const at::Tensor& x, const at::Tensor& seeds, int64_t rank,
                               int64_t out_features, double sigma, int64_t counter) {
  check_delta_shapes(x, seeds);
  const int64_t k = x.size(-1), batch = x.size(-2);
  const auto f = factors("opreg::lowrank_delta_output", rank, k, out_features, counter);
  auto out = at::empty(with(seeds.sizes(), {batch, out_features}), x.options());
  kernel_for(Family::kDeltaOutput, rank)
      ->launch({seeds.numel(), opreg::triton::cdiv(batch, kDeltaBatchBlock)},
               {x.contiguous(), seeds.contiguous(), out, batch, k, out_features, counter,
                f.b_counter, sigma});
  return out;
}

bool delta_output_accepts(const at::Tensor& x, const at::Tensor& seeds, int64_t rank,
                          int64_t out_features, double, int64_t) {
  if (x.scalar_type() != at::kFloat || x.dim() < 2 ||
      x.sizes().slice(0, x.dim() - 2) != seeds.sizes()) {
    return false;
  }
  const int64_t batch = x.size(-2);
  return seeds.numel() > 0 && seeds.numel() <= kMaxGridX && batch > 0 &&
         opreg::triton::cdiv(batch, kDeltaBatchBlock) <= kMaxGridYZ &&
         kernel_fits(Family::kDeltaOutput, seeds, rank, x.size(-1), out_features);
}

at::Tensor gradient_triton(const at::Tensor& fitness, const at::Tensor& seeds, int64_t rank,
                           int64_t out_features, int64_t in_features, double sigma,
                           int64_t counter) {
  const int64_t pop = check_gradient_shapes(fitness, seeds, sigma);
  const auto f = factors("opreg::lowrank_gradient", rank, in_features, out_features, counter);
  const auto lead = seeds.sizes().slice(0, seeds.dim() - 1);
  auto out = at::empty(with(lead, {out_features, in_features}), fitness.options());
  kernel_for(Family::kGradient, rank)
      ->launch({opreg::triton::cdiv(out_features, kGradientBlock),
                opreg::triton::cdiv(in_features, kGradientBlock), seeds.numel() / pop},
               {fitness.contiguous(), seeds.contiguous(), out, pop, in_features, out_features,
                counter, f.b_counter, static_cast<double>(pop) * sigma});
  return out;
}

bool gradient_accepts(const at::Tensor& fitness, const at::Tensor& seeds, int64_t rank,
                      int64_t out_features, int64_t in_features, double sigma, int64_t) {
  if (fitness.scalar_type() != at::kFloat || seeds.dim() < 1 || fitness.sizes() != seeds.sizes() ||
      seeds.size(-1) < 1 || sigma == 0) {
    return false;  // the fallback names the error
  }
  return seeds.size(-1) <= INT32_MAX && seeds.numel() / seeds.size(-1) <= kMaxGridYZ &&
         opreg::triton::cdiv(out_features, kGradientBlock) <= kMaxGridX &&
         opreg::triton::cdiv(in_features, kGradientBlock) <= kMaxGridYZ &&
         kernel_fits(Family::kGradient, seeds, rank, in_features, out_features);
}

const auto lowrank_delta_output_op =
    opreg::op(
        "opreg::lowrank_delta_output(Tensor x, Tensor seeds, int rank, int out_features, "
        "float sigma, int counter=0) -> Tensor")
        .fallback(delta_output_reference)
        .kernel(delta_output_triton,
                opreg::on({"cuda"}).name("triton_aot").accepts(delta_output_accepts))
        .fake(delta_output_fake)
        .dtypes("x", {at::kFloat, at::kDouble})
        .dtypes("seeds", {at::kLong})
        .batch_polymorphic()
        .define();

const auto lowrank_gradient_op =
    opreg::op(
        "opreg::lowrank_gradient(Tensor fitness, Tensor seeds, int rank, int out_features, "
        "int in_features, float sigma, int counter=0) -> Tensor")
        .fallback(gradient_reference)
        .kernel(gradient_triton, opreg::on({"cuda"}).name("triton_aot").accepts(gradient_accepts))
        .fake(gradient_fake)
        .dtypes("fitness", {at::kFloat, at::kDouble})
        .dtypes("seeds", {at::kLong})
        .batch_polymorphic()
        .define();

}  // namespace

namespace opreg {

at::Tensor lowrank_delta_output(const at::Tensor& x, const at::Tensor& seeds, int64_t rank,
                                int64_t out_features, double sigma, int64_t counter) {
  return lowrank_delta_output_op(x, seeds, rank, out_features, sigma, counter);
}

at::Tensor lowrank_gradient(const at::Tensor& fitness, const at::Tensor& seeds, int64_t rank,
                            int64_t out_features, int64_t in_features, double sigma,
                            int64_t counter) {
  return lowrank_gradient_op(fitness, seeds, rank, out_features, in_features, sigma, counter);
}

}  // namespace opreg
