// tests/cpp/test_define.cpp: defining ops with the builder, and which implementation serves a call:
// fallback, kernel, declined kernel, fake, fallback on meta; schema inference; mutation.
#include "test_util.h"

using opreg_test::call_boxed;
using opreg_test::error_of;
using opreg_test::impls_of;

namespace {

at::Tensor twice(const at::Tensor& x) { return x * 2; }
at::Tensor twice_kernel(const at::Tensor& x) { return x + x; }

TEST(Define, FallbackServesEveryDeviceWithoutKernels) {
  auto op = opreg::op("opreg_cpp::twice_fallback(Tensor x) -> Tensor").fallback(twice).define();
  auto x = at::randn({5});
  opreg::TraceScope trace;
  EXPECT_TRUE(at::equal(op(x), x * 2));
  auto meta = op(at::empty({3, 4}, at::device(at::kMeta)));
  EXPECT_EQ(meta.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(impls_of(trace.records()), (std::vector<std::string>{"fallback", "fallback(meta)"}));
}

TEST(Define, KernelServesItsDeviceAndDeclinesTheRest) {
  auto op = opreg::op("opreg_cpp::twice_kernel(Tensor x) -> Tensor")
                .fallback(twice)
                .kernel(twice_kernel, opreg::on({"cpu"}).name("cpu_add").accepts(
                                          [](const at::Tensor& x) { return x.is_contiguous(); }))
                .define();
  auto x = at::randn({4, 6});
  opreg::TraceScope trace;
  EXPECT_TRUE(at::equal(op(x), x * 2));
  EXPECT_TRUE(at::equal(op(x.t()), x.t() * 2));
  EXPECT_EQ(impls_of(trace.records()),
            (std::vector<std::string>{"kernel:cpu_add", "fallback(declined by kernel:cpu_add)"}));
  EXPECT_EQ(trace.records()[0].device, "cpu");
}

// A call whose tensors are on several devices, sent to the CPU kernel as the dispatcher would send
// a CPU+CUDA call to the CUDA one.
at::Tensor call_at_cpu_key(const char* name, const at::Tensor& x, const at::Tensor& y) {
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  torch::jit::Stack stack{x, y};
  handle.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  return stack.at(0).toTensor();
}

// Needs no data of y, which may be a meta tensor.
at::Tensor scale_by_rank(const at::Tensor& x, const at::Tensor& y) { return x * y.dim(); }

TEST(Define, KernelDeclinesACallAcrossDevices) {
  opreg::op("opreg_cpp::mixed(Tensor x, Tensor y) -> Tensor")
      .fallback(scale_by_rank)
      .kernel(scale_by_rank, opreg::on({"cpu"}).name("cpu_add"))
      .define();
  opreg::TraceScope trace;
  auto out = call_at_cpu_key("opreg_cpp::mixed", at::ones({2}), at::ones({2}, at::kMeta));
  EXPECT_TRUE(out.is_cpu());
  call_at_cpu_key("opreg_cpp::mixed", at::ones({2}), at::ones({2}));
  EXPECT_EQ(impls_of(trace.records()), (std::vector<std::string>{"fallback", "kernel:cpu_add"}));
}

TEST(Define, AllowMixedDevicesLetsTheKernelServeThem) {
  opreg::op("opreg_cpp::mixed_kernel(Tensor x, Tensor y) -> Tensor")
      .fallback(scale_by_rank)
      .kernel(scale_by_rank, opreg::on({"cpu"}).name("cpu_add"))
      .allow_mixed_devices()
      .define();
  opreg::TraceScope trace;
  call_at_cpu_key("opreg_cpp::mixed_kernel", at::ones({2}), at::ones({2}, at::kMeta));
  EXPECT_EQ(impls_of(trace.records()), (std::vector<std::string>{"kernel:cpu_add"}));
}

TEST(Define, ExplicitFakeServesMeta) {
  auto op = opreg::op("opreg_cpp::twice_fake(Tensor x) -> Tensor")
                .fallback(twice)
                .fake([](const at::Tensor& x) { return at::empty_like(x); })
                .define();
  opreg::TraceScope trace;
  auto out = op(at::empty({2, 3}, at::device(at::kMeta)));
  EXPECT_TRUE(out.is_meta());
  EXPECT_EQ(impls_of(trace.records()), (std::vector<std::string>{"fake"}));
  EXPECT_EQ(opreg::describe_op("opreg_cpp::twice_fake").fake, opreg::FakeSource::kExplicit);
}

int64_t count_positive(const at::Tensor& x, int64_t at_least) {
  return std::max(at_least, (x > 0).sum().item<int64_t>());
}

TEST(Define, SchemaIsInferredFromTheFallback) {
  auto op = opreg::op("opreg_cpp::count_positive").fallback(count_positive).define();
  auto schema = opreg::describe_op("opreg_cpp::count_positive").schema;
  EXPECT_EQ(schema, "opreg_cpp::count_positive(Tensor _0, int _1) -> int _0");
  EXPECT_EQ(op(at::tensor({1.0, -1.0, 2.0}), 0), 2);
}

void add_one_(at::Tensor& x) { x.add_(1); }

TEST(Define, MutationIsDeclaredInTheSchema) {
  auto op = opreg::op("opreg_cpp::add_one_(Tensor(a!) x) -> ()").fallback(add_one_).define();
  auto x = at::zeros({3});
  op(x);
  EXPECT_TRUE(at::equal(x, at::ones({3})));
  auto schema = opreg_test::find_op("opreg_cpp::add_one_").schema();
  EXPECT_TRUE(schema.is_mutable());
}

TEST(Define, BoxedCallsMatchTypedCalls) {
  opreg::op("opreg_cpp::twice_boxed(Tensor x) -> Tensor").fallback(twice).define();
  auto x = at::randn({7});
  auto out = call_boxed("opreg_cpp::twice_boxed", {x});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(at::equal(out[0].toTensor(), x * 2));
}

TEST(Define, ReplaceSwapsTheImplementation) {
  opreg::op("opreg_cpp::replaced(Tensor x) -> Tensor").fallback(twice).define();
  auto op = opreg::op("opreg_cpp::replaced(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) { return x * 3; })
                .replace()
                .define();
  auto x = at::randn({4});
  EXPECT_TRUE(at::equal(op(x), x * 3));
}

TEST(Define, AHandleFollowsItsOpThroughReplacement) {
  auto old_handle = opreg::op("opreg_cpp::followed(Tensor x) -> Tensor").fallback(twice).define();
  auto x = at::randn({3});
  EXPECT_TRUE(at::equal(old_handle(x), x * 2));
  opreg::op("opreg_cpp::followed(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 5; })
      .replace()
      .define();
  EXPECT_TRUE(at::equal(old_handle(x), x * 5));
}

TEST(Define, UndefinedOpsKeepTheirNameAndRefuseCalls) {
  auto op = opreg::op("opreg_cpp::temporary(Tensor x) -> Tensor").fallback(twice).define();
  EXPECT_TRUE(opreg::is_defined("opreg_cpp::temporary"));
  opreg::undefine("opreg_cpp::temporary");
  EXPECT_FALSE(opreg::is_defined("opreg_cpp::temporary"));
  // PyTorch keeps the entry, so that handles taken earlier stay safe to call.
  EXPECT_TRUE(c10::Dispatcher::singleton().findSchema({"opreg_cpp::temporary", ""}).has_value());
  EXPECT_CONTAINS(opreg_test::error_of([&] { op(at::ones({1})); }),
                  "opreg_cpp::temporary: the op is not defined now");
  opreg::op("opreg_cpp::temporary(Tensor x) -> Tensor").fallback(twice).define();
  EXPECT_TRUE(at::equal(op(at::ones({1})), at::full({1}, 2.0)));
}

TEST(Define, OriginNamesTheDefiningBinary) {
  opreg::op("opreg_cpp::with_origin(Tensor x) -> Tensor").fallback(twice).define();
  EXPECT_CONTAINS(opreg::describe_op("opreg_cpp::with_origin").origin, "opreg_cpp_tests");
}

TEST(Define, ReportListsKernelsPerDeviceType) {
  opreg::op("opreg_cpp::reported(Tensor x) -> Tensor")
      .fallback(twice)
      .kernel(twice_kernel, opreg::KernelOptions<>().name("accel"))
      .define();
  auto report = opreg::describe_op("opreg_cpp::reported");
  ASSERT_FALSE(report.kernels.empty());
  EXPECT_EQ(report.kernels[0].device_type, "cuda");
  EXPECT_EQ(report.kernels[0].kind, opreg::DeviceServing::Kind::kKernel);
  EXPECT_EQ(report.kernels[0].kernel, "accel");
  EXPECT_EQ(opreg::describe(report.kernels[0]), "kernel:accel");
}

}  // namespace

namespace {

// A boxed kernel factory: what opreg::triton::aot and the Python front give the builder.
opreg::KernelFactory boxed_plus(double value) {
  return {[value](const opreg::KernelContext& context) {
    EXPECT_EQ(context.op, "opreg_cpp::boxed");
    return c10::KernelFunction::makeFromUnboxedLambda(
        [value](const at::Tensor& x) -> at::Tensor { return x + value; });
  }};
}

TEST(Define, OneBuilderTakesBoxedFactoriesAndFlagsByName) {
  opreg::OpBuilder builder("opreg_cpp::boxed(Tensor x) -> Tensor");
  builder.fallback(boxed_plus(1.0)).kernel(boxed_plus(2.0), "plus_two", {{"cpu"}});
  builder.flag("bitwise", true).dtypes("x", {at::kFloat});
  EXPECT_EQ(std::move(builder).define(), "opreg_cpp::boxed");
  auto out = call_boxed("opreg_cpp::boxed", {at::zeros({2})});
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::full({2}, 2.0)));
  auto report = opreg::describe_op("opreg_cpp::boxed");
  EXPECT_TRUE(report.flags.bitwise);
  EXPECT_FALSE(report.flags.random);
  EXPECT_CONTAINS(opreg::describe(report), "flags:    bitwise");
  EXPECT_CONTAINS(opreg::describe(report), "dtypes:   x: Float");
  // Raised by define() (sweep 21 B-F2: a builder call's throw escaped a static initializer).
  EXPECT_CONTAINS(
      error_of([] {
        auto builder = opreg::OpBuilder("opreg_cpp::boxed2(Tensor x) -> Tensor");
        builder.fallback(opreg::detail::typed_kernel(
            std::function<at::Tensor(const at::Tensor&)>([](const at::Tensor& x) { return x; })));
        builder.flag("quick", true);
        std::move(builder).define();
      }),
      "opreg: op 'opreg_cpp::boxed2': no flag named 'quick'; the flags are: bitwise "
      "allow_mixed_devices batch_polymorphic vmap_per_example_loop random "
      "cuda_graph_unsafe");
}

// Adding a flag to OPREG_OP_FLAGS gives the typed builder its method and the report its field.
#define OPREG_TEST_FLAG(flag, promise)                                                          \
  TEST(DefineFlag, flag) {                                                                      \
    opreg::op("opreg_cpp::flag_" #flag "(Tensor x) -> Tensor").fallback(twice).flag().define(); \
    const auto report = opreg::describe_op("opreg_cpp::flag_" #flag);                           \
    EXPECT_TRUE(report.flags.flag);                                                             \
    EXPECT_CONTAINS(opreg::describe(report), #flag);                                            \
  }
OPREG_OP_FLAGS(OPREG_TEST_FLAG)
#undef OPREG_TEST_FLAG

bool tagged_cudagraph_unsafe(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").hasTag(at::Tag::cudagraph_unsafe);
}

TEST(Define, CudaGraphUnsafeTagsTheSchemaAndAReplaceFollowsTheDefinition) {
  opreg::op("opreg_cpp::graph_unsafe(Tensor x) -> Tensor").fallback(twice).define();
  EXPECT_FALSE(tagged_cudagraph_unsafe("opreg_cpp::graph_unsafe"));
  opreg::op("opreg_cpp::graph_unsafe(Tensor x) -> Tensor")
      .fallback(twice)
      .cuda_graph_unsafe()
      .replace()
      .define();
  EXPECT_TRUE(tagged_cudagraph_unsafe("opreg_cpp::graph_unsafe"));
  opreg::op("opreg_cpp::graph_unsafe(Tensor x) -> Tensor").fallback(twice).replace().define();
  EXPECT_FALSE(tagged_cudagraph_unsafe("opreg_cpp::graph_unsafe"));
}

TEST(Define, TheTypedBuilderTakesAFactoryAsAKernel) {
  auto op = opreg::op("opreg_cpp::factory_kernel(Tensor x) -> Tensor")
                .fallback(twice)
                .kernel(opreg::KernelFactory{[](const opreg::KernelContext& context) {
                          EXPECT_EQ(context.label, "kernel:boxed");
                          EXPECT_TRUE(context.fallback != nullptr);
                          return c10::KernelFunction::makeFromUnboxedLambda(
                              [](const at::Tensor& x) -> at::Tensor { return x * 3; });
                        }},
                        opreg::on({"cpu"}).name("boxed"))
                .random(false)
                .define();
  EXPECT_TRUE(at::equal(op(at::ones({2})), at::full({2}, 3.0)));
}

}  // namespace

namespace {

at::Tensor add(const at::Tensor& x, const at::Tensor& y) { return x + y; }
at::Tensor sum_all(const std::vector<at::Tensor>& xs) { return at::stack(xs).sum(0); }

opreg::Sharding sharding_of(const std::string& name) { return opreg::describe_op(name).sharding; }

TEST(DefineSharding, NoOpIsPointwiseUnlessItSaysSo) {
  // batch_polymorphic is not elementwise (a row softmax is batch-polymorphic): no default.
  opreg::op("opreg_cpp::shard_default(Tensor x, Tensor y) -> Tensor")
      .fallback(add)
      .batch_polymorphic()
      .define();
  EXPECT_EQ(sharding_of("opreg_cpp::shard_default"), opreg::Sharding::kNone);
  opreg::op("opreg_cpp::shard_pointwise(Tensor x, Tensor y) -> Tensor")
      .fallback(add)
      .batch_polymorphic()
      .sharding(opreg::Sharding::kPointwise)
      .define();
  EXPECT_CONTAINS(opreg::describe(opreg::describe_op("opreg_cpp::shard_pointwise")),
                  "dtensor:  pointwise (each rank computes its shard of the output)");
  opreg::op("opreg_cpp::shard_plain(Tensor x, Tensor y) -> Tensor").fallback(add).define();
  opreg::op("opreg_cpp::shard_random(Tensor x, Tensor y) -> Tensor")
      .fallback(add)
      .batch_polymorphic()
      .random()
      .define();
  opreg::op("opreg_cpp::shard_list(Tensor[] xs) -> Tensor")
      .fallback(sum_all)
      .batch_polymorphic()
      .define();
  for (const char* name : {"opreg_cpp::shard_default", "opreg_cpp::shard_plain",
                           "opreg_cpp::shard_random", "opreg_cpp::shard_list"}) {
    EXPECT_EQ(sharding_of(name), opreg::Sharding::kNone) << name;
  }
}

TEST(DefineSharding, ADeclarationOverridesTheDefault) {
  opreg::op("opreg_cpp::shard_replicate(Tensor x, Tensor y) -> Tensor")
      .fallback(add)
      .batch_polymorphic()
      .sharding(opreg::Sharding::kReplicate)
      .define();
  EXPECT_EQ(sharding_of("opreg_cpp::shard_replicate"), opreg::Sharding::kReplicate);
  opreg::op("opreg_cpp::shard_declared(Tensor x, Tensor y) -> Tensor")
      .fallback(add)
      .sharding(opreg::Sharding::kPointwise)
      .define();
  EXPECT_EQ(sharding_of("opreg_cpp::shard_declared"), opreg::Sharding::kPointwise);
  opreg::op("opreg_cpp::shard_declared(Tensor x, Tensor y) -> Tensor")
      .fallback(add)
      .sharding(opreg::Sharding::kNone)
      .replace()
      .define();
  EXPECT_EQ(sharding_of("opreg_cpp::shard_declared"), opreg::Sharding::kNone);
}

TEST(DefineSharding, PointwiseIsRefusedWhereTheSchemaDoesNotFit) {
  EXPECT_CONTAINS(error_of([] {
                    opreg::op("opreg_cpp::shard_bad_list(Tensor[] xs) -> Tensor")
                        .fallback(sum_all)
                        .sharding(opreg::Sharding::kPointwise)
                        .define();
                  }),
                  "opreg_cpp::shard_bad_list: sharding pointwise needs Tensor or scalar arguments "
                  "and Tensor outputs, none of them mutated, but argument 'xs' is a Tensor[] in "
                  "the schema");
  EXPECT_FALSE(opreg::is_defined("opreg_cpp::shard_bad_list"));
}

}  // namespace
