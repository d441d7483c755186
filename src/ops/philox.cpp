// src/ops/philox.cpp: opreg::philox_uniform and opreg::philox_normal, counter-based random numbers
// with Philox4x32-10 (Salmon et al., SC'11) in EvoX's layout, with a truly 64-bit counter. The
// fallback computes the same 32-bit words with int64 ATen ops on any device, so it and the AOT
// Triton kernel give bitwise identical uniforms. See docs/ops/philox.md.
#include <algorithm>
#include <cstdint>

#include <ATen/ATen.h>
#include <opreg/opreg.h>
#include <opreg/ops.h>
#include <opreg/triton.h>

namespace {

// [philox.begin]
constexpr int64_t kMask32 = 0xFFFFFFFF;
constexpr int64_t kMultiplier0 = 0xD2511F53, kMultiplier1 = 0xCD9E8D57;
constexpr int64_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;
constexpr int64_t kCallsPerProgram = 512;  // BLOCK in python/opreg/kernels/kernels.toml

at::Tensor shl(const at::Tensor& x, int64_t bits) { return at::bitwise_left_shift(x, bits); }
at::Tensor shr(const at::Tensor& x, int64_t bits) { return at::bitwise_right_shift(x, bits); }

// (hi, lo) of the 64-bit product of a 32-bit constant and 32-bit values, in int64 arithmetic:
// split the constant into 16-bit halves so no partial product overflows.
std::pair<at::Tensor, at::Tensor> mulhilo(int64_t multiplier, const at::Tensor& x) {
  auto low_part = x * (multiplier & 0xFFFF);  // < 2^48
  auto high_part = x * (multiplier >> 16);    // < 2^48
  auto sum = low_part + shl(high_part & 0xFFFF, 16);
  return {shr(high_part, 16) + shr(sum, 32), sum & kMask32};
}

// The 4 words of Philox call j = 0..calls-1 for each seed: int64 tensor [seeds, 4 * calls].
at::Tensor philox_words(const at::Tensor& seeds, int64_t calls, int64_t counter) {
  auto flat = seeds.reshape({-1, 1});
  auto k0 = flat & kMask32;
  auto k1 = shr(flat, 32) & kMask32;  // arithmetic shift, then the high word's bits
  const auto bits = static_cast<uint64_t>(counter);
  auto low = at::arange(calls, seeds.options()) + static_cast<int64_t>(bits & kMask32);
  auto c0 = (low & kMask32).unsqueeze(0);
  auto c1 = ((shr(low, 32) + static_cast<int64_t>(bits >> 32)) & kMask32).unsqueeze(0);
  auto c2 = at::zeros_like(c0), c3 = at::zeros_like(c0);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 = (k0 + kWeyl0) & kMask32;
      k1 = (k1 + kWeyl1) & kMask32;
    }
    auto [hi0, lo0] = mulhilo(kMultiplier0, c0);
    auto [hi1, lo1] = mulhilo(kMultiplier1, c2);
    auto next0 = hi1 ^ c1 ^ k0;
    auto next2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    c0 = next0;
    c2 = next2;
  }
  auto shape = c0.sizes().vec();
  return at::stack({c0.expand(shape), c1.expand(shape), c2.expand(shape), c3.expand(shape)}, -1)
      .reshape({flat.size(0), 4 * calls});
}

at::Tensor to_unit(const at::Tensor& words) {
  return shr(words, 8).to(at::kFloat) * 5.9604644775390625e-08;  // 2^-24: exact in float32
}

std::vector<int64_t> output_shape(const at::Tensor& seeds, int64_t n) {
  auto shape = seeds.sizes().vec();
  shape.push_back(n);
  return shape;
}

// n values per seed must be allocatable: the fallback holds 4 * ceil(n / 4) int64 words per seed,
// so seeds * (n + 3) * 8 bytes must fit in int64 (checked without forming the product).
void check_n(const char* op, const at::Tensor& seeds, int64_t n) {
  TORCH_CHECK_VALUE(n >= 0, op, ": argument 'n' must be >= 0, got ", n);
  const int64_t rows = std::max<int64_t>(seeds.numel(), 1);
  const int64_t max_n = (INT64_MAX / 8) / rows - 3;
  TORCH_CHECK_VALUE(n <= max_n, op, ": argument 'n' = ", n, " is too large: ", rows,
                    " seed(s) times n values cannot be allocated (n must be at most ", max_n, ")");
}

at::Tensor philox_uniform_reference(const at::Tensor& seeds, int64_t n, int64_t counter) {
  check_n("opreg::philox_uniform", seeds, n);
  auto words = philox_words(seeds, (n + 3) / 4, counter);
  return to_unit(words.narrow(-1, 0, n)).contiguous().reshape(output_shape(seeds, n));
}

// Box-Muller on consecutive pairs (2i, 2i+1) of the uniform stream, evaluated in float64 and
// rounded to float32, here and in the kernel: so the two agree to rounding, whatever libm each has.
at::Tensor philox_normal_reference(const at::Tensor& seeds, int64_t n, int64_t counter) {
  check_n("opreg::philox_normal", seeds, n);
  auto uniform = to_unit(philox_words(seeds, (n + 3) / 4, counter));
  const int64_t rows = uniform.size(0), columns = uniform.size(1);
  auto pairs = uniform.reshape({rows, columns / 2, 2}).to(at::kDouble);
  auto u1 = pairs.select(-1, 0).clamp_min(1e-10);
  auto theta = pairs.select(-1, 1) * 6.283185307179586;
  auto radius = (u1.log() * -2.0).sqrt();
  auto normal = at::stack({radius * theta.cos(), radius * theta.sin()}, -1).to(at::kFloat);
  return normal.reshape({rows, columns})
      .narrow(-1, 0, n)
      .contiguous()
      .reshape(output_shape(seeds, n));
}

at::Tensor philox_fake(const at::Tensor& seeds, int64_t n, int64_t) {
  auto shape = seeds.sym_sizes().vec();
  shape.emplace_back(n);
  return at::empty_symint(shape, seeds.options().dtype(at::kFloat));
}

const opreg::triton::Kernel& uniform_kernel() {
  static const opreg::triton::Kernel kernel("opreg_philox_uniform");
  return kernel;
}
const opreg::triton::Kernel& normal_kernel() {
  static const opreg::triton::Kernel kernel("opreg_philox_normal");
  return kernel;
}

bool fits_grid(const at::Tensor& seeds, int64_t n) {
  if (n < 0) return false;  // the fallback names the error
  const int64_t programs = opreg::triton::cdiv(opreg::triton::cdiv(n, 4), kCallsPerProgram);
  return seeds.numel() < (int64_t{1} << 31) && programs < 65536;
}

at::Tensor launch(const opreg::triton::Kernel& kernel, const char* op, const at::Tensor& seeds,
                  int64_t n, int64_t counter) {
  check_n(op, seeds, n);
  auto flat = seeds.contiguous().reshape({-1});
  auto out = at::empty({flat.numel(), n}, seeds.options().dtype(at::kFloat));
  kernel.launch({flat.numel(), opreg::triton::cdiv(opreg::triton::cdiv(n, 4), kCallsPerProgram)},
                {flat, out, n, counter});
  return out.reshape(output_shape(seeds, n));
}

const auto philox_uniform_op =
    opreg::op("opreg::philox_uniform(Tensor seeds, int n, int counter=0) -> Tensor")
        .fallback(philox_uniform_reference)
        .kernel(
            [](const at::Tensor& s, int64_t n, int64_t c) {
              return launch(uniform_kernel(), "opreg::philox_uniform", s, n, c);
            },
            opreg::on({"cuda"})
                .name("triton_aot")
                .accepts([](const at::Tensor& seeds, int64_t n, int64_t) {
                  return fits_grid(seeds, n) && uniform_kernel().available_on(seeds.get_device());
                }))
        .fake(philox_fake)
        .dtypes("seeds", {at::kLong})
        .autograd(opreg::AutogradPolicy::kNone)
        .batch_polymorphic()
        .bitwise()
        .define();

const auto philox_normal_op =
    opreg::op("opreg::philox_normal(Tensor seeds, int n, int counter=0) -> Tensor")
        .fallback(philox_normal_reference)
        .kernel([](const at::Tensor& s, int64_t n,
                   int64_t c) { return launch(normal_kernel(), "opreg::philox_normal", s, n, c); },
                opreg::on({"cuda"})
                    .name("triton_aot")
                    .accepts([](const at::Tensor& seeds, int64_t n, int64_t) {
                      return fits_grid(seeds, n) &&
                             normal_kernel().available_on(seeds.get_device());
                    }))
        .fake(philox_fake)
        .dtypes("seeds", {at::kLong})
        .autograd(opreg::AutogradPolicy::kNone)
        .batch_polymorphic()
        .define();
// [philox.end]

}  // namespace

namespace opreg {

at::Tensor philox_uniform(const at::Tensor& seeds, int64_t n, int64_t counter) {
  return philox_uniform_op(seeds, n, counter);
}

at::Tensor philox_normal(const at::Tensor& seeds, int64_t n, int64_t counter) {
  return philox_normal_op(seeds, n, counter);
}

}  // namespace opreg
