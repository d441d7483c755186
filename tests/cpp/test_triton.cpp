// tests/cpp/test_triton.cpp: the AOT Triton runtime without a GPU: binaries embedded by
// opreg_add_triton_kernels() are registered at load time with their variants; launches that
// cannot happen are refused with the kernel's name and the reason.
#include <opreg/triton.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"

using opreg_test::error_of;

namespace {

const opreg::triton::KernelReport* find_kernel(const std::vector<opreg::triton::KernelReport>& all,
                                               const std::string& name) {
  for (const auto& kernel : all) {
    if (kernel.name == name) return &kernel;
  }
  return nullptr;
}

TEST(Triton, EmbeddedKernelsAreRegisteredWithTheirVariants) {
  auto kernels = opreg::triton::describe_kernels();
  const auto* scale = find_kernel(kernels, "opreg_test_scale");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(scale->params,
            (std::vector<std::string>{"x_ptr: *fp32", "out_ptr: *fp32", "n: i64", "factor: fp32"}));
  ASSERT_EQ(scale->variants.size(), 8u);  // 2 archs x (aligned or not) x (n % 16 or not)
  EXPECT_EQ(scale->variants.front().assumptions, "x_ptr:aligned16, out_ptr:aligned16, n:div16");
  EXPECT_EQ(scale->variants.back().assumptions, "generic");
  const auto* matmul = find_kernel(kernels, "opreg_test_matmul_big_smem");
  ASSERT_NE(matmul, nullptr);
  EXPECT_GT(matmul->variants.front().shared, 48 * 1024);
}

// A library embedding a kernel with u8/u16 scalars used to abort while loading (the runtime
// refused the types in a static initializer): this executable embeds one
// (tests/kernel_sources/unsigned_kernels.toml).
TEST(Triton, UnsignedScalarParametersAreRegistered) {
  auto kernels = opreg::triton::describe_kernels();
  const auto* fill = find_kernel(kernels, "opreg_test_fill_sum_u8_u16");
  ASSERT_NE(fill, nullptr);
  EXPECT_EQ(fill->params,
            (std::vector<std::string>{"out_ptr: *fp32", "a: u8", "b: u16", "n: i32"}));
  EXPECT_EQ(fill->variants.size(), 4u);  // 2 archs x out_ptr aligned or not
}

// Registration runs while a library loads: a bad bundle is reported when its kernel is used, and
// the process goes on.
TEST(Triton, EmbeddedBundleThatFailsIsReportedNotThrown) {
  const std::string manifest =
      R"({"format": "opreg-triton-aot/1", "kernel": "opreg_test_bad_embedded",
    "params": [{"name": "x", "type": "fp8e5"}], "variants": []})";
  EXPECT_FALSE(
      opreg::triton::register_embedded_bundle(manifest.data(), manifest.size(), nullptr, 0));
  opreg::triton::Kernel kernel("opreg_test_bad_embedded");
  std::string why;
  EXPECT_FALSE(kernel.available_on(0, &why));
  EXPECT_CONTAINS(why,
                  "its embedded bundle failed to load: opreg: Triton manifest (embedded): "
                  "kernel 'opreg_test_bad_embedded', parameter 'x': unsupported parameter "
                  "type 'fp8e5'");
  EXPECT_CONTAINS(error_of([&] { kernel.launch({1}, {}); }),
                  "Triton kernel 'opreg_test_bad_embedded': its embedded bundle failed to load");
  const std::string garbage = "{not json";
  EXPECT_FALSE(opreg::triton::register_embedded_bundle(garbage.data(), garbage.size(), nullptr, 0));
}

// The sixteenth sweep: a file without a name crashed (strlen of a null pointer).
TEST(Triton, EmbeddedFilesWithNullPointersAreReportedNotFollowed) {
  const std::string manifest =
      R"({"format": "opreg-triton-aot/1", "kernel": "opreg_test_null_file_name", "params": [],
    "variants": [{"arch": 80, "entry": "k", "num_warps": 4, "num_ctas": 1, "shared": 0,
      "global_scratch_size": 0, "global_scratch_align": 1, "profile_scratch_size": 0,
      "profile_scratch_align": 1, "launch_pdl": false, "launch_cooperative_grid": false,
      "assumptions": [], "config": {}, "param_sizes": [8, 8], "file": "a.cubin"}]})";
  const unsigned char junk[4] = {1, 2, 3, 4};
  const opreg::triton::EmbeddedFile unnamed{nullptr, junk, sizeof(junk)};
  EXPECT_FALSE(
      opreg::triton::register_embedded_bundle(manifest.data(), manifest.size(), &unnamed, 1));
  std::string why;
  EXPECT_FALSE(opreg::triton::Kernel("opreg_test_null_file_name").available_on(0, &why));
  EXPECT_CONTAINS(why, "opreg: embedded Triton bundle: file 0 has no name (a null pointer)");
  const opreg::triton::EmbeddedFile without_data{"a.cubin", nullptr, 100};
  EXPECT_FALSE(
      opreg::triton::register_embedded_bundle(manifest.data(), manifest.size(), &without_data, 1));
}

TEST(Triton, CpuTensorsAreRefusedWithTheReason) {
  opreg::triton::Kernel kernel("opreg_test_scale");
  auto x = at::randn({8});
  std::string why;
  EXPECT_FALSE(kernel.can_launch({x, x, int64_t{8}, 2.0}, &why));
  EXPECT_EQ(why, "argument 'x_ptr' is on cpu, not CUDA");
  auto message = error_of([&] { kernel.launch({1}, {x, x, int64_t{8}, 2.0}); });
  EXPECT_CONTAINS(message, "cannot launch Triton kernel 'opreg_test_scale'");
}

TEST(Triton, ArgumentsAreChecked) {
  opreg::triton::Kernel kernel("opreg_test_scale");
  auto x = at::randn({8});
  std::string why;
  EXPECT_FALSE(kernel.can_launch({x, x}, &why));
  EXPECT_EQ(why, "it takes 4 arguments, 2 were given");
  EXPECT_FALSE(kernel.can_launch({x, int64_t{3}, int64_t{8}, 2.0}, &why));
  EXPECT_EQ(why, "argument 'out_ptr' must be a tensor or pointer");
  EXPECT_FALSE(kernel.can_launch({x, x, x, 2.0}, &why));
  EXPECT_EQ(why, "argument 'n' must be a number (i64)");
  // The sixteenth sweep: "argument 'x_ptr' is UNKNOWN_SCALAR, the kernel takes *fp32".
  const at::Tensor undefined;
  EXPECT_FALSE(kernel.can_launch({undefined, x, int64_t{8}, 2.0}, &why));
  EXPECT_EQ(why, "argument 'x_ptr' is an undefined tensor");
  EXPECT_CONTAINS(error_of([&] { kernel.launch({1}, {undefined, x, int64_t{8}, 2.0}); }),
                  "cannot launch Triton kernel 'opreg_test_scale': argument 'x_ptr' is an "
                  "undefined tensor");
}

TEST(Triton, UnknownKernel) {
  opreg::triton::Kernel kernel("opreg_test_missing");
  std::string why;
  EXPECT_FALSE(kernel.available_on(0, &why));
  EXPECT_EQ(why, "no binaries are registered for it");
  EXPECT_CONTAINS(error_of([&] { kernel.launch({1}, {}); }),
                  "no ahead-of-time binaries are registered for the Triton kernel "
                  "'opreg_test_missing'");
}

// Sweep 26 (B-F3): the message had a blank for the path (and "" named /index.txt).
TEST(Triton, AnEmptyBundlePathIsNamedAsSuch) {
  EXPECT_CONTAINS(error_of([&] { opreg::triton::load_bundle_dir(""); }),
                  "opreg::triton::load_bundle_dir: 'path' is empty");
}

// Sweep 28 B-F8: a config's keys were checked, not its values: num_stages = "three" or -5 and
// maxnreg = [1, 2] loaded and showed in describe_kernels(). They are checked as python3 -m
// opreg.aot checks a spec's configs.
// Writes a bundle of one kernel with one variant into a fresh folder and loads it.
class OneVariantBundle {
 public:
  explicit OneVariantBundle(const std::string& name)
      : dir_(::testing::TempDir() + name + "_" + std::to_string(getpid())) {
    std::filesystem::create_directories(dir_);
    std::string cubin(64, '\0');  // an ELF64 header for CUDA with no tables: enough to register
    cubin.replace(0, 6,
                  "\x7f"
                  "ELF\x02\x01");
    cubin[18] = static_cast<char>(190);
    std::ofstream(dir_ + "/k.cubin", std::ios::binary) << cubin;
    std::ofstream(dir_ + "/index.txt") << "k.json\n";
  }
  ~OneVariantBundle() { std::filesystem::remove_all(dir_); }

  const std::string& dir() const { return dir_; }

  // `entry` and `config` are JSON text.
  std::vector<std::string> load(const std::string& kernel, const std::string& config,
                                const std::string& entry = R"("k")") const {
    std::ofstream(dir_ + "/k.json")
        << R"({"format": "opreg-triton-aot/1", "kernel": ")" << kernel << R"(", "params": [],
    "variants": [{"arch": 80, "entry": )"
        << entry << R"(, "num_warps": 4, "num_ctas": 1, "shared": 0,
      "global_scratch_size": 0, "global_scratch_align": 1, "profile_scratch_size": 0,
      "profile_scratch_align": 1, "launch_pdl": false, "launch_cooperative_grid": false,
      "assumptions": [], "config": )"
        << config << R"(, "param_sizes": [8, 8], "file": "k.cubin"}]})";
    return opreg::triton::load_bundle_dir(dir_);
  }

 private:
  std::string dir_;
};

TEST(Triton, ABundleConfigsValuesAreChecked) {
  const OneVariantBundle bundle("opreg_config_values");
  const std::string& dir = bundle.dir();
  auto load = [&](const std::string& kernel, const std::string& config) {
    return bundle.load(kernel, config);
  };
  const std::string where = "opreg: Triton manifest " + dir +
                            "/k.json: kernel 'opreg_test_config_values', variant 0: field "
                            "'config' entry ";
  const std::vector<std::pair<std::string, std::string>> refused{
      {R"({"num_stages": "three"})",
       "'num_stages' must be a pipeline depth from 1 to 16 (an integer), got \"three\""},
      {R"({"num_stages": -5})",
       "'num_stages' must be a pipeline depth from 1 to 16 (an "
       "integer), got -5"},
      {R"({"num_stages": 3.0})",
       "'num_stages' must be a pipeline depth from 1 to 16 (an "
       "integer), got 3.0"},
      {R"({"num_stages": 17})",
       "'num_stages' must be a pipeline depth from 1 to 16 (an "
       "integer), got 17"},
      {R"({"maxnreg": [1, 2]})",
       "'maxnreg' must be a register count from 1 to 255 (an "
       "integer), got [1,2]"},
      {R"({"maxnreg": 256})", "'maxnreg' must be a register count from 1 to 255"},
      {R"({"num_ctas": true})",
       "'num_ctas' must be a CTA count from 1 to 16 (an integer), got "
       "true"},
      {R"({"num_warps": "4"})",
       "'num_warps' must be a power of two from 1 to 32 (an integer), "
       "got \"4\""},
      {R"({"num_warps": 3})", "'num_warps' must be a power of two from 1 to 32"},
  };
  for (const auto& [config, message] : refused) {
    EXPECT_CONTAINS(error_of([&] { load("opreg_test_config_values", config); }), where + message);
  }
  EXPECT_EQ(find_kernel(opreg::triton::describe_kernels(), "opreg_test_config_values"), nullptr);
  EXPECT_EQ(load("opreg_test_config_values_good",
                 R"({"num_warps": 4, "num_stages": 16, "num_ctas": 1, "maxnreg": 255})"),
            std::vector<std::string>{"opreg_test_config_values_good"});
  const auto kernels = opreg::triton::describe_kernels();
  const auto* good = find_kernel(kernels, "opreg_test_config_values_good");
  ASSERT_NE(good, nullptr);
  EXPECT_EQ(good->variants.at(0).config, "maxnreg=255 num_ctas=1 num_stages=16 num_warps=4");
}

// The entry reaches the CUDA driver as a C string: a NUL in it would name another function.
TEST(Triton, ABundleEntryMustNameAFunction) {
  const OneVariantBundle bundle("opreg_entry_names");
  const std::string where = "opreg: Triton manifest " + bundle.dir() +
                            "/k.json: kernel 'opreg_test_entry_names', variant 0: field 'entry' "
                            "must name the kernel's function in its cubin (letters, digits, _ and "
                            "$, not starting with a digit), got ";
  for (const std::string entry : {R"("add\u0000kernel")", R"("1k")", R"("a b")", R"("k\n")"}) {
    EXPECT_CONTAINS(error_of([&] { bundle.load("opreg_test_entry_names", "{}", entry); }),
                    where + entry);
  }
  EXPECT_EQ(find_kernel(opreg::triton::describe_kernels(), "opreg_test_entry_names"), nullptr);
  EXPECT_EQ(bundle.load("opreg_test_entry_names", "{}", R"("_k$1")"),
            std::vector<std::string>{"opreg_test_entry_names"});
}

TEST(Triton, AvailabilityFollowsTheDriver) {
  opreg::triton::Kernel kernel("opreg_test_scale");
  std::string driver_why;
  bool driver = opreg::triton::driver_available(&driver_why);
  std::string why;
  bool available = kernel.available_on(0, &why);
  if (!driver) {
    EXPECT_FALSE(available);
    EXPECT_CONTAINS(why, "libcuda.so.1");
  }
  EXPECT_FALSE(kernel.available_on(-1, &why));
  EXPECT_CONTAINS(why, "out of range");
}

}  // namespace

namespace {

at::Tensor add(const at::Tensor& x, const at::Tensor& y) { return x + y; }

TEST(Triton, DeclaredLaunchIsCheckedAgainstTheSchema) {
  auto message = error_of([] {
    opreg::op("opreg_aot::bad(Tensor x, Tensor y) -> Tensor")
        .fallback(add)
        .kernel(opreg::triton::aot({"opreg_test_scale",
                                    {"cdiv(numel(x), 512)"},
                                    {"x", "out0", "numel(w)", "2.0"},
                                    "like:x"}),
                opreg::on({"cuda"}).name("triton_aot"))
        .define();
  });
  EXPECT_CONTAINS(message,
                  "opreg_aot::bad: aot_kernel arguments: cannot read 'numel(w)': no "
                  "argument named 'w' (the op has: x, y)");
  EXPECT_FALSE(opreg::is_defined("opreg_aot::bad"));
}

TEST(Triton, DeclaredLaunchDeclinesCpuCallsToTheFallback) {
  auto op = opreg::op("opreg_aot::scale(Tensor x, Tensor y) -> Tensor")
                .fallback(add)
                .kernel(opreg::triton::aot({"opreg_test_scale",
                                            {"cdiv(numel(x), 512)"},
                                            {"x", "out0", "numel(x)", "2.0"},
                                            "fake"}),
                        opreg::on({"cpu"}).name("triton_aot"))
                .define();
  auto x = at::randn({7});
  opreg::TraceScope trace;
  EXPECT_TRUE(at::equal(op(x, x), x + x));
  EXPECT_EQ(opreg_test::impls_of(trace.records()),
            (std::vector<std::string>{"fallback(declined by kernel:triton_aot)", "fallback"}));
}

TEST(Triton, DeclaredLaunchExpressionsAreCheckedAtDefinition) {
  auto define = [](const std::vector<std::string>& grid, const std::vector<std::string>& args) {
    return error_of([&] {
      opreg::op("opreg_aot::checked(Tensor x, float f, int k) -> Tensor")
          .fallback([](const at::Tensor& x, double, int64_t) { return x.clone(); })
          .kernel(opreg::triton::aot({"opreg_test_scale", grid, args, "like:x"}),
                  opreg::on({"cuda"}).name("triton_aot"))
          .define();
    });
  };
  const std::vector<std::string> grid{"cdiv(numel(x), 512)"};
  EXPECT_CONTAINS(define(grid, {"x", "out0", "numel(f)", "2.0"}),
                  "opreg_aot::checked: aot_kernel arguments: cannot read 'numel(f)': argument "
                  "'f' is float, not a tensor");
  EXPECT_CONTAINS(define(grid, {"x", "out0", "--5", "2.0"}),
                  "cannot read '--5': '--5' is not an integer");
  EXPECT_CONTAINS(define(grid, {"x", "out0", "numel(x)", "1e999"}),
                  "cannot read '1e999': '1e999' is out of the range of a float (double)");
  EXPECT_CONTAINS(define({"x"}, {"x", "out0", "numel(x)", "2.0"}),
                  "aot_kernel grid: cannot read 'x': expected an integer expression, got a tensor");
  EXPECT_CONTAINS(define({"cdiv(f, 4)"}, {"x", "out0", "numel(x)", "2.0"}),
                  "cdiv needs an integer to divide, 'f' is a float");
  // Sweep 41 B-F3: an int argument there read as "'k' is not an integer".
  EXPECT_CONTAINS(define({"cdiv(k, k)"}, {"x", "out0", "numel(x)", "2.0"}),
                  "cannot read 'cdiv(k, k)': the divisor of cdiv must be an integer written out, "
                  "not 'k' (an argument of the op cannot stand there)");
  EXPECT_CONTAINS(define({"size(x, k)"}, {"x", "out0", "numel(x)", "2.0"}),
                  "the dimension of size() must be an integer written out, not 'k' (an "
                  "argument of the op cannot stand there)");
  EXPECT_FALSE(opreg::is_defined("opreg_aot::checked"));
}

// Off CUDA the kernel declines before evaluating anything: out0 has no tensor there, and
// size(x, 5) of a 1-d tensor is not the kernel's business when the fallback serves the call.
TEST(Triton, DeclaredLaunchDeclinesBeforeEvaluating) {
  auto op = opreg::op("opreg_aot::decline_first(Tensor x, Tensor y) -> Tensor")
                .fallback(add)
                .kernel(opreg::triton::aot({"opreg_test_scale",
                                            {"cdiv(size(x, 5), 512)"},
                                            {"x", "out0", "stride(x, 5)", "2.0"},
                                            "like:x"}),
                        opreg::on({"cpu"}).name("triton_aot"))
                .define();
  auto x = at::randn({7});
  opreg::TraceScope trace;
  EXPECT_TRUE(at::equal(op(x, x), x + x));
  EXPECT_EQ(opreg_test::impls_of(trace.records()).front(),
            "fallback(declined by kernel:triton_aot)");
}

}  // namespace
