// src/ops/philox.cpp: opreg::philox_uniform and opreg::philox_normal, counter-based random numbers
// with Philox4x32-10 (Salmon et al., SC'11) in EvoX's layout, with a truly 64-bit counter. The
// fallback computes the same 32-bit words with int64 ATen ops on any device, so it and the AOT
// Triton kernel give bitwise identical uniforms; normals are float32 Box-Muller computed by both
// with the same operations (Note [Float32 Box-Muller]). See docs/ops/philox.md.
#include <algorithm>
#include <cstdint>
#include <limits>

#include <ATen/ATen.h>
#include <opreg/opreg.h>
#include <opreg/ops.h>
#include <opreg/triton.h>

namespace {

// [philox.begin]
constexpr int64_t kMask32 = 0xFFFFFFFF;
constexpr int64_t kMultiplier0 = 0xD2511F53, kMultiplier1 = 0xCD9E8D57;
constexpr int64_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;
// Philox calls per program: each kernel's BLOCK in python/opreg/kernels/kernels.toml.
constexpr int64_t kUniformBlock = 2048, kNormalBlock = 512;

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

// Note [Float32 Box-Muller]
// philox_normal maps each pair (u1, u2) = (uniform[2i], uniform[2i+1]) to r cos(2 pi u2) and
// r sin(2 pi u2), r = sqrt(-2 log max(u1, 1e-10)), in float32 built only from operations that
// every device rounds the same way: +, - and * (each rounded on its own; the kernel's mul.rn /
// add.rn are never contracted into an FMA), a correctly rounded sqrt, and integer and bit
// operations. log(x): x = 2^k m with m in [sqrt(1/2), sqrt(2)) read from the bits, f = m - 1
// (exact), log(x) = f - f^2/2 + f^3 P(f) + k ln2, with ln2 split so that k * kLn2Hi is exact.
// sin and cos: the quadrant q and the remainder f in [-1/2, 1/2] of 4 u2 come from the integer
// u2 * 2^24 exactly, so 2 pi u2 = (pi/2)(q + f), and sin(pi/2 f) = f S(f^2), cos(pi/2 f) = C(f^2).
// P, S and C are fitted on those intervals; every constant is a float32 number. This fallback and
// the kernel (python/opreg/kernels/philox.py) perform the same operations in the same order with
// the same constants: change both together. Agreement and accuracy: docs/ops/philox.md.
constexpr double kLogP[] = {-0.07634492963552475, 0.12761574983596802,  -0.13160182535648346,
                            0.14201758801937103,  -0.16623356938362122, 0.20001226663589478,
                            -0.2500081956386566,  0.3333333134651184};
constexpr double kLn2Hi = 0.693359375, kLn2Lo = -0.00021219444170128554;
constexpr int64_t kSqrtHalfBits = 0x3F3504F3;
constexpr double kU1Floor = 1.0000000133514320e-10;  // float32(1e-10)
constexpr double kSinS[] = {-0.004602177068591118, 0.07968022674322128, -0.6459634900093079,
                            1.5707963705062866};
constexpr double kCosC[] = {0.0009036316769197583, -0.02086007222533226, 0.25366920232772827,
                            -1.2337005138397217, 1.0};

// c[0] x^(N-1) + ... + c[N-1] by Horner, one rounding per ATen op as in the kernel.
template <size_t N>
at::Tensor horner(const double (&c)[N], const at::Tensor& x) {
  auto acc = x * c[0] + c[1];
  for (size_t i = 2; i < N; ++i) acc = acc * x + c[i];
  return acc;
}

// Correctly rounded float32 sqrt, as the kernel's sqrt_rn. at::sqrt of float32 CPU tensors is not
// (torch 2.13: 1 ulp off for 17% of values): start from the float64 root rounded to float32, then
// take the neighbour whose rounding interval holds x. Midpoints between neighbours have 25
// significant bits, so their squares are exact in float64, and x is never equal to one.
at::Tensor sqrt_float32(const at::Tensor& x) {
  auto x64 = x.to(at::kDouble);
  auto root = x64.sqrt().to(at::kFloat);
  auto up = at::nextafter(root, at::full_like(root, std::numeric_limits<float>::infinity()));
  auto down = at::nextafter(root, at::zeros_like(root));
  auto root64 = root.to(at::kDouble);
  auto above = (root64 + up.to(at::kDouble)) * 0.5;
  auto below = (root64 + down.to(at::kDouble)) * 0.5;
  return at::where(x64 > above * above, up, at::where(x64 < below * below, down, root));
}

at::Tensor log_float32(const at::Tensor& x) {
  auto bits = x.view(at::kInt).to(at::kLong);
  auto k = shr(bits - kSqrtHalfBits, 23);
  auto f = (bits - shl(k, 23)).to(at::kInt).view(at::kFloat) - 1.0;
  auto z = f * f;
  auto kf = k.to(at::kFloat);
  auto t = horner(kLogP, f) * f * z + kf * kLn2Lo - z * 0.5;
  return f + t + kf * kLn2Hi;
}

// sin and cos of 2 pi (word >> 8) 2^-24.
std::pair<at::Tensor, at::Tensor> sincos_turn(const at::Tensor& words) {
  auto k = shr(words, 8);
  auto q = shr(k + (1 << 21), 22);
  auto f = (k - shl(q, 22)).to(at::kFloat) * 2.384185791015625e-07;  // 2^-22
  auto z = f * f;
  auto s = horner(kSinS, z) * f;
  auto c = horner(kCosC, z);
  auto swap = (q & 1) != 0;
  auto sin = at::where(swap, c, s), cos = at::where(swap, s, c);
  sin = at::where((q & 2) != 0, -sin, sin);
  cos = at::where(((q + 1) & 2) != 0, -cos, cos);
  return {sin, cos};
}

at::Tensor philox_normal_reference(const at::Tensor& seeds, int64_t n, int64_t counter) {
  check_n("opreg::philox_normal", seeds, n);
  auto words = philox_words(seeds, (n + 3) / 4, counter);
  const int64_t rows = words.size(0), columns = words.size(1);
  auto pairs = words.reshape({rows, columns / 2, 2});
  auto u1 = to_unit(pairs.select(-1, 0)).clamp_min(kU1Floor);
  auto r = sqrt_float32(log_float32(u1) * -2.0);
  auto [sin, cos] = sincos_turn(pairs.select(-1, 1));
  auto normal = at::stack({r * cos, r * sin}, -1);
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

bool fits_grid(const at::Tensor& seeds, int64_t n, int64_t block) {
  if (n < 0) return false;  // the fallback names the error
  const int64_t programs = opreg::triton::cdiv(opreg::triton::cdiv(n, 4), block);
  return seeds.numel() < (int64_t{1} << 31) && programs < 65536;
}

at::Tensor launch(const opreg::triton::Kernel& kernel, int64_t block, const char* op,
                  const at::Tensor& seeds, int64_t n, int64_t counter) {
  check_n(op, seeds, n);
  auto flat = seeds.contiguous().reshape({-1});
  auto out = at::empty({flat.numel(), n}, seeds.options().dtype(at::kFloat));
  kernel.launch({flat.numel(), opreg::triton::cdiv(opreg::triton::cdiv(n, 4), block)},
                {flat, out, n, counter});
  return out.reshape(output_shape(seeds, n));
}

const auto philox_uniform_op =
    opreg::op("opreg::philox_uniform(Tensor seeds, int n, int counter=0) -> Tensor")
        .fallback(philox_uniform_reference)
        .kernel(
            [](const at::Tensor& s, int64_t n, int64_t c) {
              return launch(uniform_kernel(), kUniformBlock, "opreg::philox_uniform", s, n, c);
            },
            opreg::on({"cuda"})
                .name("triton_aot")
                .accepts([](const at::Tensor& seeds, int64_t n, int64_t) {
                  return fits_grid(seeds, n, kUniformBlock) &&
                         uniform_kernel().available_on(seeds.get_device());
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
        .kernel(
            [](const at::Tensor& s, int64_t n, int64_t c) {
              return launch(normal_kernel(), kNormalBlock, "opreg::philox_normal", s, n, c);
            },
            opreg::on({"cuda"})
                .name("triton_aot")
                .accepts([](const at::Tensor& seeds, int64_t n, int64_t) {
                  return fits_grid(seeds, n, kNormalBlock) &&
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
