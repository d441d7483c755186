// tests/cpp/test_reliability.cpp: a replace or undefine never frees what a running call uses, a
// failed define or replace changes nothing, and calls to undefined ops raise an error naming them.
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include <torch/csrc/autograd/autograd.h>

#include "test_util.h"

using opreg_test::error_of;

namespace {

at::Tensor plus(const at::Tensor& x, double value) { return x + value; }

opreg::OpHandle<at::Tensor(const at::Tensor&)> define_plus(double value, bool replace) {
  return opreg::op("opreg_rel::plus(Tensor x) -> Tensor")
      .fallback([value](const at::Tensor& x) { return plus(x, value); })
      .kernel(
          [value](const at::Tensor& x) {
            std::this_thread::yield();  // widen the window in which a replace can happen
            return plus(x, value);
          },
          opreg::on({"cpu"}).name("slow"))
      .fake([](const at::Tensor& x) { return at::empty_like(x); })
      .replace(replace)
      .define();
}

TEST(Reliability, ReplaceWhileKernelsRun) {
  auto op = define_plus(1.0, false);
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, calls{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&] {
      auto x = at::zeros({8});
      while (!stop) {
        double value = op(x)[0].item<double>();
        if (value != 1.0 && value != 2.0) ++wrong;
        ++calls;
      }
    });
  }
  // On a loaded machine the replaces could all end before any call began.
  while (calls.load() == 0) std::this_thread::yield();
  for (int round = 0; round < 300; ++round) define_plus(round % 2 ? 1.0 : 2.0, true);
  stop = true;
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(Reliability, CallingAnUndefinedOpNamesIt) {
  auto op = opreg::op("opreg_rel::gone(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) { return x * 2; })
                .define();
  auto handle = opreg_test::find_op("opreg_rel::gone");
  opreg::undefine("opreg_rel::gone");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::gone"));
  EXPECT_CONTAINS(error_of([&] { op(at::ones({2})); }), "opreg_rel::gone: the op is not defined");
  EXPECT_CONTAINS(error_of([&] { opreg_test::call_boxed("opreg_rel::gone", {at::ones({2})}); }),
                  "opreg_rel::gone: the op is not defined");
  // Defined again (with another schema): old handles reach the new definition.
  opreg::op("opreg_rel::gone(Tensor x, float y) -> Tensor")
      .fallback([](const at::Tensor& x, double y) { return x * y; })
      .define();
  torch::jit::Stack stack{at::ones({2}), 3.0};
  handle.callBoxed(&stack);
  EXPECT_TRUE(at::equal(stack[0].toTensor(), at::full({2}, 3.0)));
}

// Fourteenth sweep: a hand-made boxed stack with a string or a float where the schema has an int
// reached the fallback's unboxing, an internal assert of PyTorch's ("please report a bug").
TEST(Reliability, ABoxedCallWithTheWrongKindOfScalarNamesTheArgument) {
  opreg::op("opreg_rel::scaled(Tensor x, int n=3, float f=1.0, bool b=False) -> Tensor")
      .fallback([](const at::Tensor& x, int64_t n, double f, bool b) { return x * n * f * b; })
      .define();
  EXPECT_CONTAINS(error_of([&] {
                    opreg_test::call_boxed("opreg_rel::scaled",
                                           {at::ones({2}), std::string("x"), 1.0, true});
                  }),
                  "opreg_rel::scaled: argument 'n' must be int, got String");
  EXPECT_CONTAINS(error_of([&] {
                    opreg_test::call_boxed("opreg_rel::scaled", {at::ones({2}), 2.5, 1.0, true});
                  }),
                  "opreg_rel::scaled: argument 'n' must be int, got Double");
  EXPECT_CONTAINS(error_of([&] {
                    opreg_test::call_boxed("opreg_rel::scaled",
                                           {at::ones({2}), int64_t{2}, 1.0, int64_t{1}});
                  }),
                  "opreg_rel::scaled: argument 'b' must be bool, got Int");
  auto stack = opreg_test::call_boxed("opreg_rel::scaled", {at::ones({2}), int64_t{2}, 1.5, true});
  EXPECT_TRUE(at::equal(stack[0].toTensor(), at::full({2}, 3.0)));
}

// 24th sweep, B-F5: a string for a Tensor? reached the fallback's unboxing, whose message named
// no argument.
TEST(Reliability, ABoxedCallWithNoTensorForAnOptionalTensorNamesTheArgument) {
  opreg::op("opreg_rel::maybe_scaled(Tensor x, Tensor? w=None) -> Tensor")
      .fallback([](const at::Tensor& x, const std::optional<at::Tensor>& w) {
        return w ? x * *w : x.clone();
      })
      .define();
  EXPECT_CONTAINS(error_of([&] {
                    opreg_test::call_boxed("opreg_rel::maybe_scaled",
                                           {at::ones({2}), std::string("w")});
                  }),
                  "opreg_rel::maybe_scaled: argument 'w' must be a Tensor or None, got String");
  auto stack = opreg_test::call_boxed("opreg_rel::maybe_scaled", {at::ones({2}), c10::IValue()});
  EXPECT_TRUE(at::equal(stack[0].toTensor(), at::ones({2})));
  stack = opreg_test::call_boxed("opreg_rel::maybe_scaled", {at::ones({2}), at::full({2}, 3.0)});
  EXPECT_TRUE(at::equal(stack[0].toTensor(), at::full({2}, 3.0)));
}

// Sweep 25 (B-F6): a generic list's elements went unchecked, so ints and strings reached the
// fallback as a Tensor?[].
TEST(Reliability, ABoxedListOfOtherValuesForOptionalTensorsIsRefused) {
  opreg::op("opreg_rel::sum_present(Tensor x, Tensor?[] more) -> Tensor")
      .fallback([](const at::Tensor& x, const c10::List<std::optional<at::Tensor>>& more) {
        at::Tensor sum = x.clone();
        for (std::optional<at::Tensor> item : more) {
          if (item) sum += *item;
        }
        return sum;
      })
      .define();
  c10::impl::GenericList numbers(c10::AnyType::get());
  numbers.push_back(1);
  numbers.push_back(2);
  EXPECT_CONTAINS(
      error_of([&] { opreg_test::call_boxed("opreg_rel::sum_present", {at::ones({2}), numbers}); }),
      "opreg_rel::sum_present: argument 'more' must be Tensor?[]");
  c10::List<std::string> words({"a", "b"});
  EXPECT_CONTAINS(
      error_of([&] { opreg_test::call_boxed("opreg_rel::sum_present", {at::ones({2}), words}); }),
      "opreg_rel::sum_present: argument 'more' must be Tensor?[]");
  c10::List<std::optional<at::Tensor>> present;
  present.push_back(at::ones({2}));
  present.push_back(std::nullopt);
  auto stack = opreg_test::call_boxed("opreg_rel::sum_present", {at::ones({2}), present});
  EXPECT_TRUE(at::equal(stack[0].toTensor(), at::full({2}, 2.0)));
}

// Sweep 26 (B-F2): a backward with the 'error' policy was accepted and the policy ignored.
TEST(Reliability, ABackwardWithAPolicyThatRefusesGradientsIsRefused) {
  for (auto policy : {opreg::AutogradPolicy::kError, opreg::AutogradPolicy::kNone}) {
    EXPECT_CONTAINS(
        error_of([&] {
          opreg::op("opreg_rel::policy_and_backward(Tensor x) -> Tensor")
              .fallback([](const at::Tensor& x) { return x * 2; })
              .autograd(policy)
              .backward([](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
                return std::vector<at::Tensor>{grads[0] * 2};
              })
              .define();
        }),
        "but a backward is given; leave one of them out");
    EXPECT_FALSE(opreg::is_defined("opreg_rel::policy_and_backward"));
  }
}

// Sweep 27 (B-F4): an int for a Generator? met PyTorch's internal assert in the fallback.
TEST(Reliability, ABoxedCallWithAnotherKindForAGeneratorNamesTheArgument) {
  opreg::op("opreg_rel::maybe_random(Tensor x, Generator? g=None) -> Tensor")
      .fallback([](const at::Tensor& x, const std::optional<at::Generator>&) { return x.clone(); })
      .define();
  EXPECT_CONTAINS(error_of([&] {
                    opreg_test::call_boxed("opreg_rel::maybe_random", {at::ones({2}), int64_t{3}});
                  }),
                  "opreg_rel::maybe_random: argument 'g' must be Generator?, got Int");
  auto stack = opreg_test::call_boxed("opreg_rel::maybe_random", {at::ones({2}), c10::IValue()});
  EXPECT_TRUE(at::equal(stack[0].toTensor(), at::ones({2})));
}

// Fourteenth sweep: both were accepted, and vmap did one of the two without a word.
TEST(Reliability, BatchPolymorphicAndThePerExampleLoopAreNotBothDeclared) {
  EXPECT_CONTAINS(error_of([&] {
                    opreg::op("opreg_rel::both_ways(Tensor x) -> Tensor")
                        .fallback([](const at::Tensor& x) { return x * 2; })
                        .batch_polymorphic()
                        .vmap_per_example_loop()
                        .define();
                  }),
                  "opreg_rel::both_ways: batch_polymorphic and vmap_per_example_loop are both");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::both_ways"));
}

TEST(Reliability, UndefiningAnOpUndefinesItsParts) {
  auto times = [](double factor) { return [factor](const at::Tensor& x) { return x * factor; }; };
  opreg::op("opreg_rel::owner(Tensor x) -> Tensor").fallback(times(2)).define();
  auto part = opreg::op("opreg_rel::owner_part(Tensor x) -> Tensor")
                  .fallback(times(3))
                  .part_of("opreg_rel::owner")
                  .define();
  opreg::op("opreg_rel::part_of_part(Tensor x) -> Tensor")  // undefined with it too
      .fallback(times(5))
      .part_of("opreg_rel::owner_part")
      .define();
  opreg::op("opreg_rel::bystander(Tensor x) -> Tensor").fallback(times(4)).define();
  opreg::undefine("opreg_rel::owner");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::owner"));
  EXPECT_FALSE(opreg::is_defined("opreg_rel::owner_part"));
  EXPECT_FALSE(opreg::is_defined("opreg_rel::part_of_part"));
  EXPECT_TRUE(opreg::is_defined("opreg_rel::bystander"));
  EXPECT_CONTAINS(error_of([&] { part(at::ones({2})); }),
                  "opreg_rel::owner_part: the op is not defined");
}

// Sweep 45 B-F4: a part its owner still calls (a vmap_fn companion) replaced on its own made
// every vmapped call of the owner say it raced a replace. As its undefine, it is refused; with
// its owner, or once the owner no longer has it, it is replaced.
TEST(Reliability, APartIsReplacedWithItsOwnerOnly) {
  auto times = [](double factor) { return [factor](const at::Tensor& x) { return x * factor; }; };
  auto part = [&](double factor) {
    return opreg::op("opreg_rel::replaced_part(Tensor x) -> Tensor")
        .fallback(times(factor))
        .part_of("opreg_rel::replaced_owner")
        .replace();
  };
  opreg::op("opreg_rel::replaced_owner(Tensor x) -> Tensor").fallback(times(2)).define();
  part(3).define();
  const auto alone = error_of([&] {
    opreg::op("opreg_rel::replaced_part(Tensor x) -> Tensor").fallback(times(4)).replace().define();
  });
  EXPECT_CONTAINS(alone,
                  "opreg_rel::replaced_part: cannot replace it on its own: it is part of "
                  "'opreg_rel::replaced_owner'");
  EXPECT_CONTAINS(error_of([&] { part(5).define(); }), "cannot replace it on its own");
  auto x = at::ones({2});
  EXPECT_TRUE(
      at::equal(opreg_test::call_boxed("opreg_rel::replaced_part", {x})[0].toTensor(), x * 3));
  std::vector<opreg::OpBuilder> together;
  together.push_back(opreg::OpBuilder("opreg_rel::replaced_owner(Tensor x) -> Tensor"));
  together.back().fallback(opreg::KernelFactory{[](const opreg::KernelContext&) {
    return c10::KernelFunction::makeFromUnboxedLambda([](const at::Tensor& x) { return x * 6; });
  }});
  together.back().replace();
  together.push_back(opreg::OpBuilder("opreg_rel::replaced_part(Tensor x) -> Tensor"));
  together.back().fallback(opreg::KernelFactory{[](const opreg::KernelContext&) {
    return c10::KernelFunction::makeFromUnboxedLambda([](const at::Tensor& x) { return x * 7; });
  }});
  together.back().part_of("opreg_rel::replaced_owner").replace();
  opreg::define_all(std::move(together));
  EXPECT_TRUE(
      at::equal(opreg_test::call_boxed("opreg_rel::replaced_part", {x})[0].toTensor(), x * 7));
  // The owner defined again without it: the part is an op of its own, replaced alone.
  opreg::op("opreg_rel::replaced_owner(Tensor x) -> Tensor").fallback(times(2)).replace().define();
  opreg::op("opreg_rel::replaced_part(Tensor x) -> Tensor").fallback(times(8)).replace().define();
  EXPECT_TRUE(
      at::equal(opreg_test::call_boxed("opreg_rel::replaced_part", {x})[0].toTensor(), x * 8));
}

TEST(Reliability, PartOfNamesAnOp) {
  for (const char* owner : {"", "not a name!", "no_namespace", "ns::", "opreg_rel::self_part"}) {
    EXPECT_CONTAINS(error_of([&] {
                      opreg::op("opreg_rel::self_part(Tensor x) -> Tensor")
                          .fallback([](const at::Tensor& x) { return x * 2; })
                          .part_of(owner)
                          .define();
                    }),
                    "opreg_rel::self_part: ");
    EXPECT_FALSE(opreg::is_defined("opreg_rel::self_part"));
  }
}

TEST(Reliability, FailedReplaceKeepsTheOp) {
  auto op = define_plus(1.0, false);
  const auto before = opreg::describe_op("opreg_rel::plus");
  auto message = error_of([] {
    opreg::op("opreg_rel::plus(Tensor x) -> Tensor")
        .fallback([](const at::Tensor& x) { return x; })
        .kernel([](const at::Tensor& x) { return x; }, opreg::on({"cpu"}).name("first"))
        .kernel([](const at::Tensor& x) { return x; }, opreg::on({"cpu"}).name("second"))
        .replace()
        .define();
  });
  EXPECT_CONTAINS(message, "both serve device type 'cpu'");
  const auto after = opreg::describe_op("opreg_rel::plus");
  EXPECT_EQ(after.schema, before.schema);
  EXPECT_EQ(after.kernels.size(), before.kernels.size());
  EXPECT_EQ(after.fake, opreg::FakeSource::kExplicit);
  EXPECT_TRUE(at::equal(op(at::zeros({2})), at::ones({2})));
}

TEST(Reliability, ABoxedCallWithTooFewArgumentsIsRefusedBeforeItIsRead) {
  opreg::op("opreg_rel::two_args(Tensor x, Tensor y) -> Tensor")
      .fallback([](const at::Tensor& x, const at::Tensor& y) { return x + y; })
      .define();
  auto message =
      error_of([] { opreg::testing::call_fallback("opreg_rel::two_args", {at::ones({1})}); });
  EXPECT_CONTAINS(message, "opreg_rel::two_args: called with 1 arguments, expected 2");
}

TEST(Reliability, AKernelReturningItsInputIsRefused) {
  auto op = opreg::op("opreg_rel::alias(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) { return x.clone(); })
                .kernel([](const at::Tensor& x) { return x; }, opreg::on({"cpu"}).name("lazy"))
                .define();
  EXPECT_CONTAINS(error_of([&] { op(at::ones({2})); }),
                  "opreg_rel::alias: kernel 'lazy' returned output 0 sharing memory with an input");
}

TEST(Reliability, ForwardModeTangentsGoThroughTheFallback) {
  auto op = opreg::op("opreg_rel::square(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) { return x * x; })
                .backward([](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
                  return std::vector<at::Tensor>{grads[0]};  // wrong on purpose: never used here
                })
                .define();
  auto x = at::tensor({1.0, 2.0, 3.0}, at::kDouble);
  const auto forward_level = torch::autograd::forward_ad::enter_dual_level();
  auto dual = at::_make_dual(x, at::ones_like(x), forward_level);
  auto out = op(dual);
  auto tangent = std::get<1>(at::_unpack_dual(out, forward_level));
  torch::autograd::forward_ad::exit_dual_level(forward_level);
  EXPECT_TRUE(at::allclose(tangent, 2 * x));
}

}  // namespace

namespace {

TEST(Reliability, AFallbackOrFakeReturningAnotherDeviceIsRefused) {
  auto op = opreg::op("opreg_rel::wrong_device(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) { return at::empty_like(x, at::kMeta); })
                .fake([](const at::Tensor& x) { return at::empty(x.sizes()); })
                .define();
  EXPECT_CONTAINS(error_of([&] { op(at::ones({2})); }),
                  "opreg_rel::wrong_device: the fallback returned output 0 on meta, expected cpu");
  EXPECT_CONTAINS(error_of([&] { op(at::ones({2}, at::kMeta)); }),
                  "opreg_rel::wrong_device: the fake returned output 0 on cpu, expected meta");
}

TEST(Reliability, DtypesAreCheckedOnMetaAndUnderAutogradToo) {
  auto op = opreg::op("opreg_rel::typed(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) { return x * 2; })
                .dtypes("x", {at::kFloat})
                .define();
  const std::string expected = "opreg_rel::typed: argument 'x' has dtype Double";
  EXPECT_CONTAINS(error_of([&] { op(at::ones({2}, at::kDouble)); }), expected);
  EXPECT_CONTAINS(error_of([&] { op(at::ones({2}, at::dtype(at::kDouble).device(at::kMeta))); }),
                  expected);
  EXPECT_CONTAINS(error_of([&] { op(at::ones({2}, at::kDouble).requires_grad_()); }), expected);
}

}  // namespace

namespace {

// Eighth sweep: two outputs on one memory were accepted, and eager code writing one saw the
// other change where torch.compile kept them apart.
TEST(Reliability, OutputsSharingMemoryWithEachOtherAreRefused) {
  auto op = opreg::op("opreg_rel::pair(Tensor x) -> (Tensor, Tensor)")
                .fallback([](const at::Tensor& x) {
                  auto y = x + 1;
                  return std::make_tuple(y, y);
                })
                .define();
  EXPECT_CONTAINS(error_of([&] { op(at::ones({2})); }),
                  "opreg_rel::pair: the fallback returned outputs 0 and 1 sharing memory");
}

// Collects the warnings raised on this thread while it lives.
class CapturedWarnings final : public c10::WarningHandler {
 public:
  explicit CapturedWarnings(std::vector<std::string>* into) : into_(into), guard_(this) {}
  void process(const c10::Warning& warning) override { into_->push_back(warning.msg()); }

 private:
  std::vector<std::string>* into_;
  c10::WarningUtils::WarningHandlerGuard guard_;
};

// Eighth sweep: a fallback computed outside autograd gave gradients without the op's part,
// silently; opreg cannot tell it from a constant, so it warns, once per op.
TEST(Reliability, AGradientThroughAFallbackComputedOutsideAutogradWarns) {
  auto op = opreg::op("opreg_rel::detached(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) { return x.detach() * 2; })
                .define();
  auto x = at::ones({3}, at::kDouble).requires_grad_();
  std::vector<std::string> warnings;
  {
    CapturedWarnings captured(&warnings);
    (op(x).sum() + x.sum()).backward();
  }
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_CONTAINS(warnings[0],
                  "opreg_rel::detached: a gradient reached output 0, which is not connected to "
                  "its inputs");
  EXPECT_TRUE(at::equal(x.grad(), at::ones({3}, at::kDouble)));
}

}  // namespace

namespace {

// Thirteenth sweep: an undefined tensor in a Tensor[] output reached Python as None.
TEST(Reliability, AnUndefinedTensorInATensorListOutputIsRefused) {
  auto op = opreg::op("opreg_rel::holes(Tensor x) -> Tensor[]")
                .fallback([](const at::Tensor& x) {
                  return std::vector<at::Tensor>{x + 1, at::Tensor()};
                })
                .define();
  EXPECT_CONTAINS(error_of([&] { op(at::ones({2})); }),
                  "opreg_rel::holes: the fallback returned output 0 holding an undefined tensor "
                  "at element 1, expected a Tensor");
  auto optional = opreg::op("opreg_rel::optional_holes(Tensor x) -> Tensor?[]")
                      .fallback([](const at::Tensor& x) {
                        return c10::List<std::optional<at::Tensor>>({x + 1, std::nullopt});
                      })
                      .define();
  EXPECT_EQ(optional(at::ones({2})).size(), 2u);
}

// Thirteenth sweep: an output declared an alias of x that shared y's memory passed.
TEST(Reliability, AnOutputDeclaredAnAliasMustShareWhatItAliases) {
  auto op = opreg::op("opreg_rel::view_of(Tensor(a) x, Tensor y) -> Tensor(a)")
                .fallback([](const at::Tensor& x, const at::Tensor& y) { return y.view(-1); })
                .define();
  EXPECT_CONTAINS(error_of([&] { op(at::zeros({3}), at::ones({3})); }),
                  "opreg_rel::view_of: the fallback returned output 0 sharing memory with "
                  "argument 'y', but the schema");
}

}  // namespace

namespace {

// Thirteenth sweep: a kernel named "" was accepted, and reports showed it as "kernel:".
TEST(Reliability, AKernelWithAnEmptyNameIsRefused) {
  auto message = error_of([] {
    opreg::op("opreg_rel::unnamed(Tensor x) -> Tensor")
        .fallback([](const at::Tensor& x) { return x + 1; })
        .kernel([](const at::Tensor& x) { return x + 1; }, opreg::on({"cpu"}).name(""))
        .define();
  });
  EXPECT_CONTAINS(message, "opreg_rel::unnamed: a kernel has an empty name");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::unnamed"));
}

}  // namespace

// ---- sixteenth sweep ----------------------------------------------------------------------------

at::Tensor twice(const at::Tensor& x) { return x * 2; }

// An empty KernelFunction from a factory was accepted, and the first call segfaulted; a factory
// with no function hit an internal assert; an empty std::function failed its calls with a bare
// bad_function_call.
TEST(Reliability, EmptyPiecesAreRefusedAtTheDefinition) {
  opreg::OpBuilder empty_kernel_function("opreg_rel::empty_kf(Tensor x) -> Tensor");
  empty_kernel_function.fallback(
      opreg::KernelFactory{[](const opreg::KernelContext&) { return c10::KernelFunction(); }});
  EXPECT_CONTAINS(error_of([&] { std::move(empty_kernel_function).define(); }),
                  "opreg_rel::empty_kf: the factory of its fallback made an empty "
                  "c10::KernelFunction");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::empty_kf"));

  opreg::OpBuilder no_make("opreg_rel::no_make(Tensor x) -> Tensor");
  no_make.fallback(opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(twice)))
      .kernel(opreg::KernelFactory{}, "k", std::vector<std::string>{"cpu"});
  EXPECT_CONTAINS(error_of([&] { std::move(no_make).define(); }),
                  "opreg_rel::no_make: the factory of its kernel:k is empty");

  EXPECT_CONTAINS(error_of([&] {
                    opreg::op("opreg_rel::empty_fn(Tensor x) -> Tensor")
                        .fallback(twice)
                        .kernel(std::function<at::Tensor(const at::Tensor&)>(),
                                opreg::on({"cpu"}).name("k"))
                        .define();
                  }),
                  "opreg_rel::empty_fn: its kernel:k is an empty function");
  EXPECT_CONTAINS(error_of([&] {
                    opreg::op("opreg_rel::empty_fn(Tensor x) -> Tensor")
                        .fallback(twice)
                        .fake(std::function<at::Tensor(const at::Tensor&)>())
                        .define();
                  }),
                  "opreg_rel::empty_fn: its fake is an empty function");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::empty_fn"));
}

TEST(Reliability, DeclarationsOutsideTheirEnumsAreRefused) {
  auto declared = [] { return opreg::op("opreg_rel::enums(Tensor x) -> Tensor").fallback(twice); };
  EXPECT_CONTAINS(
      error_of([&] { declared().autograd(static_cast<opreg::AutogradPolicy>(42)).define(); }),
      "opreg_rel::enums: autograd policy 42 is no opreg::AutogradPolicy");
  EXPECT_CONTAINS(error_of([&] { declared().sharding(static_cast<opreg::Sharding>(77)).define(); }),
                  "opreg_rel::enums: sharding 77 is no opreg::Sharding");
  for (auto dtype : {c10::ScalarType::Undefined, c10::ScalarType::NumOptions,
                     static_cast<c10::ScalarType>(200)}) {
    EXPECT_CONTAINS(error_of([&] { declared().dtypes("x", {at::kFloat, dtype}).define(); }),
                    "opreg_rel::enums: dtypes() for argument 'x' lists ScalarType");
  }
  EXPECT_FALSE(opreg::is_defined("opreg_rel::enums"));
}

// A ScalarType of 999 reached the fallback (which segfaulted in x.to(d)); other kinds in list,
// str and Device slots met PyTorch's internal asserts.
TEST(Reliability, ABoxedCallWithAValueOfAnotherKindOrBeyondItsEnumIsRefused) {
  opreg::op(
      "opreg_rel::kinds(Tensor x, ScalarType d, Layout? l=None, int[] sizes=[], str s='a', "
      "Device dev='cpu', float[] fs=[]) -> Tensor")
      .fallback([](const at::Tensor& x, at::ScalarType d, std::optional<at::Layout>,
                   std::vector<int64_t>, std::string, at::Device,
                   std::vector<double>) { return x.to(d); })
      .define();
  auto call = [](std::vector<c10::IValue> args) {
    return error_of([&] { opreg_test::call_boxed("opreg_rel::kinds", std::move(args)); });
  };
  const at::Tensor x = at::ones({2});
  const c10::IValue d(static_cast<int64_t>(at::kDouble)), none, cpu(at::Device("cpu"));
  const c10::IValue sizes(c10::List<int64_t>({1})), floats(c10::List<double>({1.0}));
  EXPECT_CONTAINS(
      call({x, int64_t{999}, none, sizes, "a", cpu, floats}),
      "opreg_rel::kinds: argument 'd' is 999, which is not a ScalarType (expected 0 to");
  EXPECT_CONTAINS(call({x, d, int64_t{250}, sizes, "a", cpu, floats}),
                  "opreg_rel::kinds: argument 'l' is 250, which is not a Layout");
  EXPECT_CONTAINS(call({x, d, none, floats, "a", cpu, floats}),
                  "opreg_rel::kinds: argument 'sizes' must be int[], got float[]");
  EXPECT_CONTAINS(call({x, d, none, sizes, int64_t{3}, cpu, floats}),
                  "opreg_rel::kinds: argument 's' must be str, got Int");
  EXPECT_CONTAINS(call({x, d, none, sizes, "a", "cpu", floats}),
                  "opreg_rel::kinds: argument 'dev' must be Device, got String");
  EXPECT_CONTAINS(call({x, d, none, sizes, "a", cpu, sizes}),
                  "opreg_rel::kinds: argument 'fs' must be float[], got int[]");
  auto stack = opreg_test::call_boxed("opreg_rel::kinds", {x, d, none, sizes, "a", cpu, floats});
  EXPECT_EQ(stack[0].toTensor().scalar_type(), at::kDouble);
}

// C++ gives no tensor for a Tensor? as an undefined one: the fallback met it engaged and undefined
// (an internal assert of TensorIterator's).
TEST(Reliability, AnUndefinedTensorForAnOptionalTensorIsNone) {
  auto op = opreg::op("opreg_rel::maybe_add(Tensor x, Tensor? y) -> Tensor")
                .fallback([](const at::Tensor& x, const std::optional<at::Tensor>& y) {
                  return y.has_value() ? x + *y : x * 2;
                })
                .define();
  EXPECT_TRUE(at::equal(op(at::ones({2}), at::Tensor()), at::full({2}, 2.0)));
  EXPECT_TRUE(at::equal(op(at::ones({2}), at::ones({2})), at::full({2}, 2.0)));
}

// A typed handle kept across a replace that added an output returned the first output alone; one
// across an argument's change of type was told the call raced the replace.
TEST(Reliability, ATypedHandleChecksItsSignatureAgainAfterASchemaChange) {
  auto handle = opreg::op("opreg_rel::reshaped(Tensor x) -> Tensor").fallback(twice).define();
  EXPECT_TRUE(at::equal(handle(at::ones({1})), at::full({1}, 2.0)));
  opreg::op("opreg_rel::reshaped(Tensor x) -> (Tensor, Tensor)")
      .fallback([](const at::Tensor& x) { return std::make_tuple(x * 2, x * 3); })
      .replace()
      .define();
  EXPECT_CONTAINS(error_of([&] { handle(at::ones({1})); }),
                  "opreg: op 'opreg_rel::reshaped': the handle's C++ signature does not match the "
                  "schema");
  opreg::op("opreg_rel::reshaped(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 4; })
      .replace()
      .define();
  EXPECT_TRUE(at::equal(handle(at::ones({1})), at::full({1}, 4.0)));
}

// Sweep 50 A n09: a caller made for the earlier schema (an AOTInductor package) was told only
// that it raced the replace and should call again, which can never succeed.
TEST(Reliability, ACallerMadeForAnEarlierSchemaIsToldToBeMadeAgain) {
  opreg::op("opreg_rel::shortened(Tensor x, float s, int k) -> Tensor")
      .fallback([](const at::Tensor& x, double s, int64_t) { return x * s; })
      .define();
  opreg::op("opreg_rel::shortened(Tensor x, float s) -> Tensor")
      .fallback([](const at::Tensor& x, double s) { return x * s; })
      .replace()
      .define();
  const std::string error = error_of(
      [] { opreg_test::call_boxed("opreg_rel::shortened", {at::ones({1}), 2.0, int64_t{3}}); });
  EXPECT_CONTAINS(error, "opreg_rel::shortened: called with 3 arguments, expected 2");
  EXPECT_CONTAINS(error,
                  "a caller made for the other schema (an OpHandle typed for it, an AOTInductor "
                  "package, a scripted function) must be made again for this one");
}

// The check read the dispatcher's schema, which the replacing thread frees (a segfault, or a loop
// that ate all memory formatting it; ASan: SEGV in operator<<(FunctionSchema)).
TEST(Reliability, ATypedHandleCalledWhileTheSchemaChangesRaisesOrCalls) {
  auto one = [](const at::Tensor& x) { return x + 1; };
  opreg::op("opreg_rel::flipping(Tensor x) -> Tensor").fallback(one).define();
  opreg::OpHandle<at::Tensor(const at::Tensor&)> handle("opreg_rel::flipping");
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::thread caller([&] {
    const auto x = at::zeros({4});
    while (!stop) {
      try {
        const auto result = handle(x);
        EXPECT_TRUE(at::equal(result, at::ones({4})) || at::equal(result, at::full({4}, 5.0)));
      } catch (const c10::Error& error) {  // the signature does not fit now, or the call raced
        // Sweep 33 B-F2: in the instant the dispatcher held no schema, "no op named ...".
        EXPECT_EQ(error.msg().find("no op named"), std::string::npos) << error.msg();
      }
      ++calls;
    }
  });
  for (int k = 0; k < 3000; ++k) {
    if (k % 2 == 0) {
      opreg::op("opreg_rel::flipping(Tensor x, int k=5) -> Tensor")
          .fallback([](const at::Tensor& x, int64_t k) { return x + static_cast<double>(k); })
          .replace()
          .define();
    } else {
      opreg::op("opreg_rel::flipping(Tensor x) -> Tensor").fallback(one).replace().define();
    }
  }
  stop = true;
  caller.join();
  EXPECT_GT(calls.load(), 0);
  EXPECT_TRUE(at::equal(handle(at::zeros({4})), at::ones({4})));
}

// A factory's own exception reached the caller as it was: no op, no piece (`throw 42`: an int).
TEST(Reliability, AFactoryThatThrowsAtDefineIsNamed) {
  for (const bool an_int : {false, true}) {
    opreg::OpBuilder builder("opreg_rel::factory_throws(Tensor x) -> Tensor");
    builder.fallback(
        opreg::KernelFactory{[an_int](const opreg::KernelContext&) -> c10::KernelFunction {
          if (an_int) throw 42;
          throw std::runtime_error("boom");
        }});
    const std::string error = error_of([&] { std::move(builder).define(); });
    EXPECT_CONTAINS(error, "opreg_rel::factory_throws: the factory of its fallback threw");
    EXPECT_CONTAINS(error, an_int ? "something that is not a std::exception" : "boom");
  }
  EXPECT_CONTAINS(error_of([] { opreg::describe_op("opreg_rel::factory_throws"); }),
                  "no op named 'opreg_rel::factory_throws'");
}

// Sweep 48 B-F3: a kernel factory that replaced its own op was published first and then
// overwritten by the replace it ran in, whose serial was older: the serial went back (7, 9, 8)
// and replace_only of the newest was told the op never had it. Such a definition is refused,
// while one building another op's, defined with it or not, and each other op stays as it was.
TEST(Reliability, AKernelFactoryCannotDefineTheOpItsBuildDefines) {
  auto factory_defining = [](std::string name, double factor) {
    return opreg::KernelFactory{[name, factor](const opreg::KernelContext&) {
      opreg::OpBuilder inner(name + "(Tensor x) -> Tensor");
      inner.fallback(opreg::detail::typed_kernel(
          std::function<at::Tensor(const at::Tensor&)>([](const at::Tensor& x) { return x; })));
      inner.replace();
      std::move(inner).define();
      return c10::KernelFunction::makeFromUnboxedLambda(
          [factor](const at::Tensor& x) { return x * factor; });
    }};
  };
  opreg::op("opreg_rel::self_factory(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 2; })
      .define();
  const uint64_t serial = opreg::detail::definition_serial("opreg_rel::self_factory");
  opreg::OpBuilder outer("opreg_rel::self_factory(Tensor x) -> Tensor");
  outer.fallback(factory_defining("opreg_rel::self_factory", 3));
  outer.replace();
  const std::string error = error_of([&] { std::move(outer).define(); });
  EXPECT_CONTAINS(error,
                  "opreg_rel::self_factory: defined while a definition of "
                  "opreg_rel::self_factory is being built");
  EXPECT_EQ(opreg::detail::definition_serial("opreg_rel::self_factory"), serial);
  auto x = at::ones({2});
  EXPECT_TRUE(
      at::equal(opreg_test::call_boxed("opreg_rel::self_factory", {x})[0].toTensor(), x * 2));
  // Defined together: the second one's factory defining the first.
  std::vector<opreg::OpBuilder> together;
  together.emplace_back("opreg_rel::self_factory(Tensor x) -> Tensor");
  together.back().fallback(factory_defining("opreg_rel::other_factory_op", 5)).replace();
  together.emplace_back("opreg_rel::self_factory_second(Tensor x) -> Tensor");
  together.back().fallback(factory_defining("opreg_rel::self_factory", 7));
  const std::string together_error = error_of([&] { opreg::define_all(std::move(together)); });
  EXPECT_CONTAINS(together_error, "opreg_rel::self_factory: defined while a definition of");
  EXPECT_CONTAINS(together_error,
                  "in the factory of the fallback of opreg_rel::self_factory_second");
  EXPECT_EQ(opreg::detail::definition_serial("opreg_rel::self_factory"), serial);
  EXPECT_FALSE(opreg::is_defined("opreg_rel::self_factory_second"));
  // Another op's factory defining a third op is a definition like any other.
  opreg::OpBuilder building_another("opreg_rel::self_factory(Tensor x) -> Tensor");
  building_another.fallback(factory_defining("opreg_rel::other_factory_op", 11)).replace();
  std::move(building_another).define();
  EXPECT_GT(opreg::detail::definition_serial("opreg_rel::self_factory"), serial);
  EXPECT_TRUE(opreg::is_defined("opreg_rel::other_factory_op"));
  EXPECT_TRUE(
      at::equal(opreg_test::call_boxed("opreg_rel::self_factory", {x})[0].toTensor(), x * 11));
}

// Sweep 50 B-F1: a kernel factory that undefined the op its replace builds ran twice, the second
// time finding no op: the replace failed and the op was gone.
TEST(Reliability, AKernelFactoryCannotUndefineTheOpItsBuildDefines) {
  opreg::op("opreg_rel::undefined_by_factory(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 2; })
      .define();
  const uint64_t serial = opreg::detail::definition_serial("opreg_rel::undefined_by_factory");
  opreg::OpBuilder outer("opreg_rel::undefined_by_factory(Tensor x) -> Tensor");
  outer.fallback(opreg::KernelFactory{[](const opreg::KernelContext&) {
    opreg::undefine("opreg_rel::undefined_by_factory");
    return c10::KernelFunction::makeFromUnboxedLambda([](const at::Tensor& x) { return x * 3; });
  }});
  outer.replace();
  EXPECT_CONTAINS(error_of([&] { std::move(outer).define(); }),
                  "opreg: cannot undefine 'opreg_rel::undefined_by_factory' while a definition "
                  "of it is being built");
  EXPECT_EQ(opreg::detail::definition_serial("opreg_rel::undefined_by_factory"), serial);
  auto x = at::ones({2});
  EXPECT_TRUE(at::equal(
      opreg_test::call_boxed("opreg_rel::undefined_by_factory", {x})[0].toTensor(), x * 2));
}

// Sweep 50 B-P3: a long part_of chain defined at once was walked whole from each of its ops.
TEST(Reliability, ALongPartOfChainIsDefinedAndACycleAtItsEndFound) {
  auto part = [](int index, int owner) {
    opreg::OpBuilder builder("opreg_rel::chain" + std::to_string(index) + "(Tensor x) -> Tensor");
    builder.fallback(
        opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(twice)));
    if (owner >= 0) builder.part_of("opreg_rel::chain" + std::to_string(owner));
    return builder;
  };
  constexpr int kLength = 3000;
  std::vector<opreg::OpBuilder> cycle;
  for (int i = 0; i < kLength; ++i) cycle.push_back(part(i, (i + 1) % kLength));
  EXPECT_CONTAINS(error_of([&] { opreg::define_all(std::move(cycle)); }), "makes a cycle");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::chain0"));
  std::vector<opreg::OpBuilder> chain;
  for (int i = 0; i < kLength; ++i) chain.push_back(part(i, i + 1 < kLength ? i + 1 : -1));
  opreg::define_all(std::move(chain));
  EXPECT_TRUE(opreg::is_defined("opreg_rel::chain0"));
  opreg::undefine("opreg_rel::chain" + std::to_string(kLength - 1));
  EXPECT_FALSE(opreg::is_defined("opreg_rel::chain0"));
}

// Sweep 47 B-F3: a failed define_all destroyed the definitions it had built while it held the
// registry's lock: a factory's captured state whose destructor waits for a thread that asks
// opreg anything (describe_op) hung forever. They are destroyed once the lock is released.
TEST(Reliability, AFailedDefinitionDropsWhatItBuiltOutsideTheLock) {
  struct AsksFromAnotherThread {
    ~AsksFromAnotherThread() {
      std::thread([] { (void)opreg::is_defined("opreg_rel::dropped_outside"); }).join();
    }
  };
  auto done = std::async(std::launch::async, [] {
    auto asks = std::make_shared<AsksFromAnotherThread>();
    opreg::OpBuilder built("opreg_rel::dropped_outside(Tensor x) -> Tensor");
    built.fallback(opreg::KernelFactory{[asks](const opreg::KernelContext&) {
      return c10::KernelFunction::makeFromUnboxedLambda([](const at::Tensor& x) { return x + 1; });
    }});
    asks.reset();  // the factory holds the only reference
    opreg::OpBuilder refused("opreg_rel::refused(Tensor x, Tensr y) -> Tensor");
    std::vector<opreg::OpBuilder> builders;
    builders.push_back(std::move(built));
    builders.push_back(std::move(refused));
    return error_of([&] { opreg::define_all(std::move(builders)); });
  });
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "define_all hung while dropping what it built";
    std::_Exit(1);  // the hung thread cannot be joined
  }
  EXPECT_CONTAINS(done.get(), "Tensr");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::dropped_outside"));
}

TEST(Reliability, AnEmptyLibraryPathIsRefused) {
  EXPECT_CONTAINS(error_of([&] { opreg::load_library(""); }),
                  "opreg::load_library: 'path' is empty");
}

// Sweep 37 B-F3: the message stopped at the NUL ("cannot load '/tmp/x"), its reason lost.
TEST(Reliability, ALibraryPathHoldingANulIsNamedWhole) {
  const auto error = error_of([] { opreg::load_library(std::string("/tmp/x\0y.so", 11)); });
  EXPECT_CONTAINS(error, "opreg::load_library: cannot load '/tmp/x\\x00y.so': ");
  EXPECT_EQ(std::string(error.c_str()), error);  // no NUL left to end a C string
}

// Sweep 21 B-F6: a FIFO blocked load_library's reads (and dlopen's) without end.
TEST(Reliability, ALibraryPathThatIsNoRegularFileIsRefused) {
  const std::string fifo = ::testing::TempDir() + "opreg_fifo_" + std::to_string(getpid()) + ".so";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const auto error = error_of([&] { opreg::load_library(fifo); });
  unlink(fifo.c_str());
  EXPECT_CONTAINS(error,
                  "opreg::load_library: cannot load '" + fifo + "': it is not a regular file");
  EXPECT_CONTAINS(error_of([&] { opreg::load_library("/"); }), "it is not a regular file");
}

// Sweep 28 B-F7: a library loaded from a path, replaced there by another file (a rebuild) and
// loaded again: the dynamic loader handed back the library mapped for that path, and the load
// reported success with none of the new file's ops defined.
TEST(Reliability, ALibraryRebuiltUnderALoadedPathIsRefused) {
  // glibc's stubs of the libraries merged into libc (2.34 and later): two other files, each a
  // library with no code of its own.
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  link_map* map = nullptr;
  ASSERT_EQ(dlinfo(libc, RTLD_DI_LINKMAP, &map), 0);
  const auto system = std::filesystem::path(map->l_name).parent_path();
  dlclose(libc);
  const auto one = system / "libdl.so.2", other = system / "libutil.so.1";
  if (!std::filesystem::exists(one) || !std::filesystem::exists(other)) {
    GTEST_SKIP() << "no " << one << " and " << other << " (glibc 2.34 or later) here";
  }
  const auto dir =
      std::filesystem::path(::testing::TempDir()) / ("opreg_rebuilt_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir / "libopreg_rebuilt.so";
  std::filesystem::copy_file(one, path);
  opreg::load_library(path);
  opreg::load_library(path);  // the same file again

  // Another file at the path (new inode), as a build that writes a new file leaves it.
  std::filesystem::remove(path);
  std::filesystem::copy_file(other, path);
  const std::string refused =
      "opreg::load_library: cannot load '" + path +
      "': a library was loaded from that path earlier in this process, from another file than "
      "the one there now (loaded: device ";
  auto error = error_of([&] { opreg::load_library(path); });
  EXPECT_CONTAINS(error, refused);
  EXPECT_CONTAINS(error,
                  "a process cannot load a rebuilt library under the same path again: restart "
                  "the process to load it");
  EXPECT_EQ(error_of([&] { opreg::load_library(path); }), error);  // the failure changed nothing
  const std::string copy = dir / "libopreg_rebuilt_copy.so";
  std::filesystem::copy_file(path, copy);
  opreg::load_library(copy);

  // The same file written again in place (its modification time changes), and then put back.
  struct stat before{};
  ASSERT_EQ(stat(copy.c_str(), &before), 0);
  timespec times[2] = {before.st_atim, before.st_mtim};
  times[1].tv_sec += 10;
  ASSERT_EQ(utimensat(AT_FDCWD, copy.c_str(), times, 0), 0);
  EXPECT_CONTAINS(error_of([&] { opreg::load_library(copy); }),
                  "opreg::load_library: cannot load '" + copy + "': a library was loaded");
  times[1] = before.st_mtim;
  ASSERT_EQ(utimensat(AT_FDCWD, copy.c_str(), times, 0), 0);
  opreg::load_library(copy);
  std::filesystem::remove_all(dir);
}

TEST(Reliability, TheCpuAndMetaAreNoAcceleratedDeviceTypes) {
  for (const char* type : {"cpu", "meta", " CPU "}) {
    EXPECT_CONTAINS(error_of([&] { opreg::register_accelerated_device_type(type); }),
                    "is no accelerator");
  }
  const auto types = opreg::accelerated_device_types();
  EXPECT_EQ(std::count(types.begin(), types.end(), "cpu"), 0);
}

// testing::call_fallback held only the fallback's kernel, whose definition a replace freed under
// it (a segfault; opreg.opcheck and Python fakes of ops without tensors call it too).
TEST(Reliability, CallFallbackWhileTheOpIsReplaced) {
  auto define = [](double value) {
    opreg::op("opreg_rel::replaced_under_call_fallback(Tensor x) -> Tensor")
        .fallback([value](const at::Tensor& x) {
          std::this_thread::yield();  // widen the window in which a replace can happen
          return x + value;
        })
        .replace()
        .define();
  };
  define(1.0);
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, calls{0};
  std::thread caller([&] {
    while (!stop) {
      auto outputs = opreg::testing::call_fallback("opreg_rel::replaced_under_call_fallback",
                                                   {at::zeros({4})});
      const double value = outputs.at(0).toTensor()[0].item<double>();
      if (value != 1.0 && value != 2.0) ++wrong;
      ++calls;
    }
  });
  for (int round = 0; round < 2000; ++round) define(round % 2 ? 1.0 : 2.0);
  stop = true;
  caller.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(calls.load(), 0);
}

// Sweep 33 B-F4: testing::check checked a sample's count against one schema, then its boxed
// call ran under another with one argument more, and PyTorch read before the stack's start
// (AddressSanitizer: heap-buffer-overflow). Sweep 33 B-F2: a check was told the op was undefined.
TEST(Reliability, CheckWhileTheSchemaChanges) {
  auto define = [](bool with_k) {
    if (with_k) {
      opreg::op("opreg_rel::checked_flipping(Tensor x, int k=2) -> Tensor")
          .fallback([](const at::Tensor& x, int64_t k) { return x * k; })
          .kernel([](const at::Tensor& x, int64_t k) { return x * k; }, opreg::on({"cpu"}))
          .replace()
          .define();
    } else {
      opreg::op("opreg_rel::checked_flipping(Tensor x) -> Tensor")
          .fallback([](const at::Tensor& x) { return x * 2; })
          .kernel([](const at::Tensor& x) { return x * 2; }, opreg::on({"cpu"}))
          .replace()
          .define();
    }
  };
  define(false);
  std::atomic<bool> stop{false};
  std::atomic<int> passed{0};
  auto checker = [&] {
    while (!stop) {
      try {
        for (const auto& result :
             opreg::testing::check("opreg_rel::checked_flipping", {{at::ones({3})}})) {
          EXPECT_TRUE(result.passed) << result.check << ": " << result.message;
        }
        ++passed;
      } catch (const c10::Error& error) {  // the sample fits one schema only, or it raced
        EXPECT_EQ(error.msg().find("no op named"), std::string::npos) << error.msg();
      }
    }
  };
  std::thread first(checker), second(checker);
  for (int round = 0; round < 600; ++round) define(round % 2 == 0);
  stop = true;
  first.join();
  second.join();
  define(false);
  EXPECT_TRUE(opreg::testing::check("opreg_rel::checked_flipping", {{at::ones({3})}}).at(0).passed);
}

// Nineteenth sweep B-F4: call_fallback (and testing::check through it) handed an undefined tensor
// given for a Tensor? to the fallback as an engaged optional; dispatched calls give None.
TEST(Reliability, CallFallbackGivesAnUndefinedOptionalTensorAsNone) {
  opreg::op("opreg_rel::optional_none(Tensor x, Tensor? y) -> Tensor")
      .fallback([](const at::Tensor& x, const std::optional<at::Tensor>& y) {
        return y.has_value() ? x + 1 : x * 1;
      })
      .define();
  auto outputs =
      opreg::testing::call_fallback("opreg_rel::optional_none", {at::zeros({1}), at::Tensor()});
  EXPECT_TRUE(at::equal(outputs.at(0).toTensor(), at::zeros({1})));
}

// Sweep 22 B-F3, B-F10: a builder's methods threw (python_fake(""), since private; any method of
// a builder already defined), which aborts a library's static initializer, and flag(nullptr)
// wrote through a null member pointer. Now each is kept, and define() raises the first.
TEST(Reliability, BuilderMistakesAreRaisedByDefine) {
  auto with_fallback = [](const char* schema) {
    opreg::OpBuilder builder(schema);
    builder.fallback(
        opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(twice)));
    return builder;
  };
  auto null_flag = with_fallback("opreg_rel::null_flag(Tensor x) -> Tensor");
  null_flag.flag(static_cast<bool opreg::OpFlags::*>(nullptr), true);
  EXPECT_CONTAINS(error_of([&] { std::move(null_flag).define(); }),
                  "opreg: op 'opreg_rel::null_flag': flag() got a null member pointer");
  auto defined = with_fallback("opreg_rel::defined_once(Tensor x) -> Tensor");
  std::move(defined).define();
  defined.fallback(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(twice)));
  defined.flag("bitwise", true);
  EXPECT_CONTAINS(error_of([&] { std::move(defined).define(); }),
                  "this OpBuilder was already defined (or moved from); make a new one");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::null_flag"));
  EXPECT_TRUE(opreg::is_defined("opreg_rel::defined_once"));
}

// Sweep 39 b19-2: while a replace registers an op's schema anew, a call on another thread reads
// none of its arguments' dispatch keys and reaches the fallback's kernel past autograd: the
// fallback's ops were differentiated instead of the op's backward. Such a call is dispatched
// again; a redispatch with no keys makes the same call.
TEST(Reliability, ACallThatReadNoDispatchKeysStillTakesTheOpsBackward) {
  opreg::op("opreg_rel::no_keys(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 5; })
      .backward([](opreg::AutogradContext&, const std::vector<at::Tensor>& grads) {
        return std::vector<at::Tensor>{grads[0] * 7};
      })
      .define();
  auto handle = opreg_test::find_op("opreg_rel::no_keys");
  auto x = at::ones({2}).requires_grad_();
  torch::jit::Stack stack{x};
  handle.redispatchBoxed(c10::DispatchKeySet(), &stack);
  const auto y = stack.at(0).toTensor();
  EXPECT_TRUE(at::equal(y.detach(), at::full({2}, 5.0)));
  const auto grads = torch::autograd::grad({y.sum()}, {x});
  EXPECT_TRUE(at::equal(grads[0], at::full({2}, 7.0)));
}

// Sweep 41 B-F2: KernelContext::label referred to a temporary of the definition's build, so a
// kernel that kept it (as it may keep op and schema) read freed memory at its calls.
TEST(Reliability, AKernelKeepsItsContextsReferencesAsLongAsItLives) {
  opreg::OpBuilder builder("opreg_rel::keeps_context(Tensor x) -> Tensor");
  builder.fallback(opreg::KernelFactory{[](const opreg::KernelContext&) {
    return c10::KernelFunction::makeFromUnboxedLambda([](const at::Tensor& x) { return x * 2; });
  }});
  std::vector<std::string> seen;
  builder.kernel(opreg::KernelFactory{[&seen](const opreg::KernelContext& context) {
                   const std::string* op = &context.op;
                   const std::string* label = &context.label;
                   const c10::FunctionSchema* schema = &context.schema;
                   return c10::KernelFunction::makeFromUnboxedLambda(
                       [&seen, op, label, schema](const at::Tensor& x) {
                         seen = {*op, *label, schema->name()};
                         return x * 2;
                       });
                 }},
                 "keeps", std::vector<std::string>{"cpu"});
  std::move(builder).define();
  for (int i = 0; i < 20; ++i) {  // reuses the memory a temporary of the build had
    opreg::op("opreg_rel::after_keeps_" + std::to_string(i) + "(Tensor x) -> Tensor")
        .fallback([](const at::Tensor& x) { return x + 1; })
        .define();
  }
  opreg_test::call_boxed("opreg_rel::keeps_context", {at::ones({2})});
  EXPECT_EQ(seen, (std::vector<std::string>{"opreg_rel::keeps_context", "kernel:keeps",
                                            "opreg_rel::keeps_context"}));
}

// Sweep 41 A-F3: a definition that replaces only the op's earlier one, made while the op was
// undefined, was refused as if another definition had been made meanwhile, naming no one.
TEST(Reliability, ReplacingOnlyAnOpUndefinedMeanwhileSaysItWasUndefined) {
  opreg::op("opreg_rel::undefined_meanwhile(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 2; })
      .define();
  const uint64_t serial = opreg::detail::definition_serial("opreg_rel::undefined_meanwhile");
  opreg::undefine("opreg_rel::undefined_meanwhile");
  opreg::OpBuilder again("opreg_rel::undefined_meanwhile(Tensor x) -> Tensor");
  again.fallback(opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(twice)));
  again.replace_only(serial);
  EXPECT_CONTAINS(error_of([&] { std::move(again).define(); }),
                  "opreg_rel::undefined_meanwhile: the op was undefined while this definition "
                  "was made, and it replaces only the op's earlier definition");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::undefined_meanwhile"));
}

// Sweep 46 B: a serial the op never had (past its current one) was said to be a definition
// made meanwhile; an earlier one is said with both serials.
TEST(Reliability, ReplacingOnlyASerialTheOpNeverHadNamesBoth) {
  opreg::op("opreg_rel::replaced_only(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 2; })
      .define();
  const uint64_t first = opreg::detail::definition_serial("opreg_rel::replaced_only");
  opreg::op("opreg_rel::replaced_only(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 3; })
      .replace()
      .define();
  const uint64_t now = opreg::detail::definition_serial("opreg_rel::replaced_only");
  const auto replacing_only = [](uint64_t serial) {
    opreg::OpBuilder again("opreg_rel::replaced_only(Tensor x) -> Tensor");
    again.fallback(
        opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(twice)));
    again.replace_only(serial);
    return error_of([&] { std::move(again).define(); });
  };
  EXPECT_CONTAINS(replacing_only(now + 1000),
                  "opreg_rel::replaced_only: replace_only(" + std::to_string(now + 1000) +
                      ") names no definition this op had (its definition now is serial " +
                      std::to_string(now) + ")");
  EXPECT_CONTAINS(replacing_only(first), "serial " + std::to_string(now) +
                                             ") while this definition was made, and it replaces "
                                             "only the op's earlier definition (serial " +
                                             std::to_string(first) + ")");
  EXPECT_EQ(opreg::detail::definition_serial("opreg_rel::replaced_only"), now);
}

// Sweep 50 B-RO3: replace_only of a name never defined defined it.
TEST(Reliability, ReplacingOnlyANameNeverDefinedIsRefused) {
  const uint64_t serial = opreg::detail::definition_serial("opreg_rel::replaced_only");
  opreg::OpBuilder builder("opreg_rel::never_defined(Tensor x) -> Tensor");
  builder.fallback(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(twice)));
  builder.replace_only(serial + 1);
  EXPECT_CONTAINS(error_of([&] { std::move(builder).define(); }),
                  "opreg_rel::never_defined: replace_only(" + std::to_string(serial + 1) +
                      ") replaces the op's definition of that serial, but no op of this name was "
                      "ever defined");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::never_defined"));
}

// Sweep 50 B-T5: a typed piece taking at::ScalarType (or Layout, MemoryFormat) where the schema
// declares `int` was accepted, and an int outside the enum reached it unchecked (a segfault).
TEST(Reliability, ACppEnumParameterNeedsTheSchemasEnum) {
  const std::string fallback_error = error_of([] {
    opreg::op("opreg_rel::enum_as_int(Tensor x, int dtype) -> Tensor")
        .fallback([](const at::Tensor& x, at::ScalarType dtype) { return x.to(dtype); })
        .define();
  });
  EXPECT_CONTAINS(fallback_error,
                  "argument 'dtype' is ScalarType in C++ but int in the schema, which would pass "
                  "it any int; declare it ScalarType in the schema");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::enum_as_int"));
  EXPECT_CONTAINS(error_of([] {
                    opreg::op("opreg_rel::enum_as_int(Tensor x, int? layout) -> Tensor")
                        .fallback([](const at::Tensor& x, std::optional<at::Layout>) { return x; })
                        .define();
                  }),
                  "argument 'layout' is Layout? in C++ but int? in the schema");
  opreg::OpBuilder with_kernel("opreg_rel::enum_as_int(Tensor x, int format) -> Tensor");
  with_kernel.fallback(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&, int64_t)>(
          [](const at::Tensor& x, int64_t) { return x; })));
  with_kernel.kernel(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&, at::MemoryFormat)>(
          [](const at::Tensor& x, at::MemoryFormat) { return x; })),
      "k", std::vector<std::string>{"cpu"});
  EXPECT_CONTAINS(error_of([&] { std::move(with_kernel).define(); }),
                  "argument 'format' is MemoryFormat in C++ but int in the schema");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::enum_as_int"));
  // Declared as the enum, the values are checked; the int the schema passes reads right in C++.
  auto op = opreg::op("opreg_rel::enum_as_int(Tensor x, ScalarType dtype) -> Tensor")
                .fallback([](const at::Tensor& x, at::ScalarType dtype) { return x.to(dtype); })
                .define();
  EXPECT_EQ(op(at::ones({2}), at::kDouble).scalar_type(), at::kDouble);
  EXPECT_CONTAINS(error_of([] {
                    opreg_test::call_boxed("opreg_rel::enum_as_int",
                                           {at::ones({2}), int64_t{100000}});
                  }),
                  "dtype");
}

// Sweep 50 B-C3: testing::call_fallback's own wrong values were said to be a kernel's.
TEST(Reliability, CallFallbacksWrongValuesAreSaidAsItsCallers) {
  opreg::op("opreg_rel::called_directly(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 2; })
      .define();
  const std::string error =
      error_of([] { opreg::testing::call_fallback("opreg_rel::called_directly", {"x"}); });
  EXPECT_CONTAINS(error, "opreg_rel::called_directly: argument 'x' must be a Tensor, got String");
  EXPECT_EQ(error.find("a kernel"), std::string::npos) << error;
}

// Sweep 48 B-M3: a C++ builder without a schema was told none can be inferred from a Python
// function.
TEST(Reliability, ABuilderWithoutASchemaIsToldInCppsWords) {
  opreg::OpBuilder builder("opreg_rel::no_schema");
  builder.fallback(opreg::KernelFactory{[](const opreg::KernelContext&) {
    return c10::KernelFunction::makeFromUnboxedLambda([](const at::Tensor& x) { return x; });
  }});
  const std::string error = error_of([&] { std::move(builder).define(); });
  EXPECT_CONTAINS(error, "opreg: op 'opreg_rel::no_schema': no schema given");
  EXPECT_CONTAINS(error, "a boxed or factory-made C++ piece has no signature to infer one from");
  EXPECT_EQ(error.find("Python"), std::string::npos) << error;
}

using BoxedPiece =
    std::function<void(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack*)>;

// A KernelFactory of a boxed piece, which `make(context)` gives.
opreg::KernelFactory boxed_factory(std::function<BoxedPiece(const opreg::KernelContext&)> make) {
  struct Boxed final : c10::OperatorKernel {
    explicit Boxed(BoxedPiece piece) : piece(std::move(piece)) {}
    void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                    torch::jit::Stack* stack) {
      piece(op, keys, stack);
    }
    BoxedPiece piece;
  };
  return opreg::KernelFactory{[make = std::move(make)](const opreg::KernelContext& context) {
    return c10::KernelFunction::makeFromBoxedFunctor(std::make_unique<Boxed>(make(context)));
  }};
}

// Sweep 43 B-F1/B-F2: KernelContext::fallback took the kernel's stack unchecked: too few values
// read before it (a segfault; AddressSanitizer: heap-buffer-overflow), an undefined tensor reached
// ATen's internal assert. It checks the stack as a dispatched call's arguments.
TEST(Reliability, AKernelsCallOfItsFallbackIsCheckedAsACall) {
  opreg::OpBuilder builder("opreg_rel::kernel_calls_fallback(Tensor x, int mode) -> Tensor");
  builder.fallback(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&, int64_t)>(
          [](const at::Tensor& x, int64_t) { return x * 2; })));
  builder.kernel(boxed_factory([](const opreg::KernelContext& context) -> BoxedPiece {
                   return [fallback = context.fallback](const c10::OperatorHandle& op,
                                                        c10::DispatchKeySet keys,
                                                        torch::jit::Stack* stack) {
                     const int64_t mode = stack->back().toInt();
                     const at::Tensor x = (*stack)[stack->size() - 2].toTensor();
                     stack->clear();
                     if (mode == 1) stack->push_back(x);
                     if (mode == 2) *stack = {at::Tensor(), c10::IValue(int64_t{0})};
                     if (mode == 3) *stack = {x, c10::IValue(int64_t{0})};
                     fallback->callBoxed(op, keys, stack);
                   };
                 }),
                 "calls_fallback", std::vector<std::string>{"cpu"});
  std::move(builder).define();
  const auto call = [](int64_t mode) {
    return opreg_test::call_boxed("opreg_rel::kernel_calls_fallback", {at::ones({2}), mode});
  };
  EXPECT_CONTAINS(error_of([&] { call(0); }),
                  "opreg_rel::kernel_calls_fallback: called with 0 arguments, expected 2");
  EXPECT_CONTAINS(error_of([&] { call(1); }),
                  "opreg_rel::kernel_calls_fallback: called with 1 arguments, expected 2");
  EXPECT_CONTAINS(error_of([&] { call(2); }),
                  "opreg_rel::kernel_calls_fallback: argument 'x' must be a Tensor, got None");
  // Said of the kernel's values, not its caller's (sweep 46 B-F3).
  for (const int64_t mode : {0, 1, 2}) {
    EXPECT_CONTAINS(error_of([&] { call(mode); }),
                    "in the values a kernel of opreg_rel::kernel_calls_fallback gave "
                    "KernelContext::fallback");
  }
  EXPECT_TRUE(at::equal(call(3)[0].toTensor(), at::full({2}, 2.0)));
}

// Sweep 43 B-F4/B-F5: what a piece a KernelFactory built boxed threw passed as it was: `throw 42`
// as "Caught an unknown exception!", a runtime_error naming no op, one not UTF-8 as Python's
// UnicodeDecodeError. It is said with the op and the piece, as a typed piece's throw is.
TEST(Reliability, ABoxedPiecesThrowIsSaidWithTheOpAndThePiece) {
  opreg::OpBuilder builder("opreg_rel::boxed_throws(Tensor x, int what) -> Tensor");
  builder.fallback(boxed_factory([](const opreg::KernelContext&) -> BoxedPiece {
    return [](const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
      const int64_t what = stack->back().toInt();
      if (what == 0) throw 42;
      if (what == 1) throw std::out_of_range("past the end");
      throw std::runtime_error("\xff\xfe not UTF-8");
    };
  }));
  std::move(builder).define();
  const auto call = [](int64_t what) {
    return opreg_test::call_boxed("opreg_rel::boxed_throws", {at::ones({2}), what});
  };
  EXPECT_CONTAINS(error_of([&] { call(0); }),
                  "opreg_rel::boxed_throws: the fallback threw something that is not a "
                  "std::exception");
  EXPECT_CONTAINS(error_of([&] { call(1); }),
                  "opreg_rel::boxed_throws: the fallback threw: past the end");
  EXPECT_CONTAINS(error_of([&] { call(2); }),
                  "opreg_rel::boxed_throws: the fallback threw: \\xff\\xfe not UTF-8");
}

// Sweep 44 B-F2: a std::exception of the user's own passes as it is, but one whose message is not
// UTF-8 reached Python as a UnicodeDecodeError naming nothing.
TEST(Reliability, AUsersOwnExceptionWhoseMessageIsNotUtf8IsSaidWithTheOp) {
  struct OwnError : std::exception {
    const char* what() const noexcept override { return "\xff own"; }
  };
  opreg::OpBuilder builder("opreg_rel::own_exception(Tensor x) -> Tensor");
  builder.fallback(boxed_factory([](const opreg::KernelContext&) -> BoxedPiece {
    return [](const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack*) {
      throw OwnError();
    };
  }));
  std::move(builder).define();
  EXPECT_CONTAINS(
      error_of([] { opreg_test::call_boxed("opreg_rel::own_exception", {at::ones({2})}); }),
      "opreg_rel::own_exception: the fallback threw: \\xff own");
}

// Sweep 44 B-F3: a kernel factory's own c10 error (a TORCH_CHECK in it) named neither the op nor
// the piece whose factory raised it.
TEST(Reliability, AFactorysOwnErrorNamesTheOpAndThePiece) {
  opreg::OpBuilder builder("opreg_rel::factory_checks(Tensor x) -> Tensor");
  builder.fallback(opreg::KernelFactory{[](const opreg::KernelContext&) -> c10::KernelFunction {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "not made here");
  }});
  const std::string error = error_of([&] { std::move(builder).define(); });
  EXPECT_CONTAINS(error, "not made here");
  EXPECT_CONTAINS(error, "in the factory of the fallback of opreg_rel::factory_checks");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::factory_checks"));
}

// Sweep 51 B-N6: a user's exception whose what() returns a null pointer was read as a C string,
// a segfault, from any piece and from a kernel factory. B-N8: the base std::exception itself
// reached Python as "std::exception", naming neither the op nor the piece.
TEST(Reliability, AnExceptionWithANullOrBareMessageIsSaidWithTheOp) {
  struct NullWhat : std::exception {
    const char* what() const noexcept override { return nullptr; }
  };
  for (const bool null_what : {true, false}) {
    auto handle = opreg::op("opreg_rel::null_what(Tensor x) -> Tensor")
                      .fallback([null_what](const at::Tensor&) -> at::Tensor {
                        if (null_what) throw NullWhat();
                        throw std::exception();
                      })
                      .replace()
                      .define();
    EXPECT_CONTAINS(error_of([&] { handle(at::ones({2})); }),
                    null_what ? "opreg_rel::null_what: fallback threw: (its what() returned a "
                                "null pointer)"
                              : "opreg_rel::null_what: fallback threw: std::exception");
  }
  opreg::OpBuilder builder("opreg_rel::null_what_factory(Tensor x) -> Tensor");
  builder.fallback(opreg::KernelFactory{
      [](const opreg::KernelContext&) -> c10::KernelFunction { throw NullWhat(); }});
  EXPECT_CONTAINS(error_of([&] { std::move(builder).define(); }),
                  "opreg_rel::null_what_factory: the factory of its fallback threw: (its what() "
                  "returned a null pointer)");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::null_what_factory"));
}

// Sweep 51 B-N1: a typed handle reads the op's results; one typed as a C++ enum where the schema
// returns `int` took any int unchecked (an at::ScalarType of -96).
TEST(Reliability, AHandleReadingAnIntResultAsAnEnumIsRefused) {
  opreg::op("opreg_rel::int_result(Tensor x, int v) -> int")
      .fallback([](const at::Tensor&, int64_t v) { return v; })
      .define();
  EXPECT_CONTAINS(error_of([] {
                    opreg::OpHandle<at::ScalarType(const at::Tensor&, int64_t)>(
                        "opreg_rel::int_result")(at::ones({1}), 100000);
                  }),
                  "result 0 is ScalarType in the handle's C++ signature but int in the schema");
  opreg::OpHandle<int64_t(const at::Tensor&, int64_t)> as_int("opreg_rel::int_result");
  EXPECT_EQ(as_int(at::ones({1}), 100000), 100000);
}

// Sweep 51 B-N3: a ScalarType[] holding an int beyond the enum was told it "must be ScalarType[],
// got int[]", as [6], an int[] too, is one; said now with the element and the enum's range.
TEST(Reliability, AnEnumListBeyondItsEnumNamesTheElement) {
  opreg::op("opreg_rel::dtypes(Tensor x, ScalarType[] ds) -> Tensor")
      .fallback([](const at::Tensor& x, c10::List<int64_t>) { return x.clone(); })
      .define();
  EXPECT_NO_THROW(
      opreg_test::call_boxed("opreg_rel::dtypes", {at::ones({1}), c10::List<int64_t>({6})}));
  EXPECT_CONTAINS(error_of([] {
                    opreg_test::call_boxed("opreg_rel::dtypes",
                                           {at::ones({1}), c10::List<int64_t>({6, 999})});
                  }),
                  "opreg_rel::dtypes: argument 'ds': element 1 is 999, which is not a ScalarType "
                  "(expected 0 to ");
  auto returns = opreg::op("opreg_rel::dtypes_out(Tensor x) -> ScalarType[]")
                     .fallback([](const at::Tensor&) { return c10::List<int64_t>({6, 999}); })
                     .define();
  EXPECT_CONTAINS(
      error_of([&] { opreg_test::call_boxed("opreg_rel::dtypes_out", {at::ones({1})}); }),
      "the fallback returned a list for output 0 whose element 1 is 999, which is not "
      "a ScalarType");
}

// Sweep 51 B-N17: a value of another kind for a Tensor was told to declare 'Tensor?' to accept
// None; the hint is for None alone.
TEST(Reliability, TheTensorHintIsForNoneOnly) {
  opreg::op("opreg_rel::needs_tensor(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x.clone(); })
      .define();
  const std::string given_str = error_of(
      [] { opreg_test::call_boxed("opreg_rel::needs_tensor", {c10::IValue(std::string("s"))}); });
  EXPECT_CONTAINS(given_str, "argument 'x' must be a Tensor, got String (schema '");
  EXPECT_EQ(given_str.find("Tensor? x"), std::string::npos) << given_str;
  EXPECT_CONTAINS(
      error_of([] { opreg_test::call_boxed("opreg_rel::needs_tensor", {c10::IValue()}); }),
      "must be a Tensor, got None (declare it 'Tensor? x' in the schema to accept None)");
}

// Sweep 51 B-N14: a library of this version built with another compiler (another layout of
// opreg's types) was told it was "built against opreg 0.2.0 headers, but the loaded libopreg is
// opreg 0.2.0".
TEST(Reliability, ALibraryOfThisVersionWithAnotherLayoutIsToldSo) {
  opreg::AbiTag other;
  other.factory_size += 8;
  opreg::OpBuilder builder("opreg_rel::other_layout(Tensor x) -> Tensor");
  builder.fallback(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(twice)));
  const std::string error = error_of([&] { std::move(builder).define(other); });
  EXPECT_CONTAINS(error, "opreg_rel::other_layout: its library was built against opreg");
  EXPECT_CONTAINS(error,
                  "with another compiler or C++ standard library: opreg's KernelFactory is " +
                      std::to_string(other.factory_size) + " bytes there");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::other_layout"));
}

// Sweep 51 B-N24: part_of("ns::x.default"), PyTorch's spelling of the op ns::x, was accepted, and
// the part outlived ns::x's undefine; lookups of that spelling did not say what it is.
TEST(Reliability, PyTorchsDefaultOverloadSpellingIsExplained) {
  opreg::op("opreg_rel::spelled(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x.clone(); })
      .define();
  EXPECT_CONTAINS(error_of([] {
                    opreg::op("opreg_rel::spelled_part(Tensor x) -> Tensor")
                        .fallback([](const at::Tensor& x) { return x.clone(); })
                        .part_of("opreg_rel::spelled.default")
                        .define();
                  }),
                  "part_of('opreg_rel::spelled.default') names no op ('opreg_rel::spelled.default' "
                  "is PyTorch's spelling of the op 'opreg_rel::spelled', which opreg names without "
                  "'.default')");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::spelled_part"));
  for (auto lookup :
       std::vector<std::function<void()>>{[] {
                                            opreg::OpHandle<at::Tensor(const at::Tensor&)>(
                                                "opreg_rel::spelled.default")(at::ones({1}));
                                          },
                                          [] { opreg::describe_op("opreg_rel::spelled.default"); },
                                          [] { opreg::undefine("opreg_rel::spelled.default"); }}) {
    EXPECT_CONTAINS(error_of(lookup), "is PyTorch's spelling of the op 'opreg_rel::spelled'");
  }
  EXPECT_TRUE(opreg::is_defined("opreg_rel::spelled"));
}

// Sweep 51 B-N23: undefining an op walked every op for each of its parts, under the registry's
// lock (16000 parts: 28 s). Parts of parts in a long chain are all undefined, the bystander kept.
TEST(Reliability, UndefiningALongChainOfPartsUndefinesEachPart) {
  constexpr int kParts = 2000;
  std::vector<opreg::OpBuilder> chain;
  auto name = [](int i) { return "opreg_rel::link" + std::to_string(i); };
  for (int i = 0; i <= kParts; ++i) {
    opreg::OpBuilder builder(name(i) + "(Tensor x) -> Tensor");
    builder.fallback(
        opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(twice)));
    if (i > 0) builder.part_of(name(i - 1));
    chain.push_back(std::move(builder));
  }
  opreg::define_all(std::move(chain));
  opreg::op("opreg_rel::link_bystander(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x.clone(); })
      .define();
  const auto start = std::chrono::steady_clock::now();
  opreg::undefine(name(0));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int i = 0; i <= kParts; ++i) ASSERT_FALSE(opreg::is_defined(name(i))) << name(i);
  EXPECT_TRUE(opreg::is_defined("opreg_rel::link_bystander"));
  // Linear: milliseconds; the quadratic walk took seconds for this many (a loose bound, for
  // sanitized and loaded machines).
  EXPECT_LT(seconds, 20.0);
}

// Sweep 51 A-F1: an op defined again after an undefine was no replace to the listener that drops
// torch.compile's code, which then ran the earlier definition's code (wrong values, a double
// free). It is one now, from C++ as from Python (the listener is told outside opreg's locks).
TEST(Reliability, AnOpDefinedAgainAfterAnUndefineTellsTheReplaceListener) {
  std::atomic<int> told{0};
  opreg::detail::set_replace_listener([&told] { ++told; });
  auto define = [] {
    opreg::op("opreg_rel::defined_again(Tensor x) -> Tensor")
        .fallback([](const at::Tensor& x) { return x * 2; })
        .define();
  };
  EXPECT_FALSE(opreg::detail::defined_before("opreg_rel::defined_again"));
  define();
  EXPECT_EQ(told.load(), 0);  // a first definition drops nothing
  opreg::undefine("opreg_rel::defined_again");
  EXPECT_TRUE(opreg::detail::defined_before("opreg_rel::defined_again"));
  define();
  EXPECT_EQ(told.load(), 1);
  opreg::detail::set_replace_listener(nullptr);
}

// Sweep 52 B-N1: a user's exception whose what() rebuilds its message on each call (the pointer
// of the last call freed) passes as it is; opreg read what() twice, the first pointer after the
// second call freed it (a segfault; a use after free under AddressSanitizer).
TEST(Reliability, AnExceptionWhoseWhatRebuildsItsMessagePassesAsItIs) {
  struct Rebuilding : std::exception {
    mutable std::string message;
    const char* what() const noexcept override {
      message = std::string(1 << 16, 'r');  // a new buffer each time
      return message.c_str();
    }
  };
  auto handle = opreg::op("opreg_rel::rebuilding_what(Tensor x) -> Tensor")
                    .fallback([](const at::Tensor&) -> at::Tensor { throw Rebuilding(); })
                    .define();
  bool caught = false;
  try {
    handle(at::ones({2}));
  } catch (const Rebuilding& error) {
    caught = std::string(error.what()) == std::string(1 << 16, 'r');
  }
  EXPECT_TRUE(caught);
}

// Sweep 52 B-N43: PyTorch's unboxing gives a handle's `at::Tensor&` result the call's in-place
// argument; on an op returning a new tensor, the handle returned its own argument (1 for 10).
TEST(Reliability, AHandleTakingANewTensorAsAReferenceIsRefused) {
  opreg::op("opreg_rel::fresh_result(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 10; })
      .define();
  at::Tensor x = at::ones({1});
  EXPECT_CONTAINS(
      error_of([&] { opreg::OpHandle<at::Tensor&(at::Tensor&)>("opreg_rel::fresh_result")(x); }),
      "result 0 is a Tensor reference in the handle's C++ signature, which PyTorch's typed call "
      "returns as its argument 0 ('x'), but the schema returns a new tensor there");
  opreg::op("opreg_rel::in_place_result(Tensor(a!) x) -> Tensor(a!)")
      .fallback([](at::Tensor& x) -> at::Tensor& { return x.mul_(10); })
      .define();
  at::Tensor& same = opreg::OpHandle<at::Tensor&(at::Tensor&)>("opreg_rel::in_place_result")(x);
  EXPECT_EQ(&same, &x);
  EXPECT_EQ(x.item<float>(), 10.0f);
}

// Sweep 53 B-N1: the handle returned the argument PyTorch's typed call picks (the first for an
// in-place signature, else the last ones), which the schema's result need not alias: x for y, and
// two results swapped, with no error.
TEST(Reliability, AHandleWhoseReferenceResultIsAnotherArgumentIsRefused) {
  opreg::op("opreg_rel::writes_second(Tensor(a!) x, Tensor(b!) y) -> Tensor(b!)")
      .fallback([](at::Tensor& x, at::Tensor& y) -> at::Tensor& { return y.add_(100); })
      .define();
  at::Tensor x = at::ones({1}) * 2, y = at::ones({1});
  EXPECT_CONTAINS(
      error_of([&] {
        opreg::OpHandle<at::Tensor&(at::Tensor&, at::Tensor&)>("opreg_rel::writes_second")(x, y);
      }),
      "returns as its argument 0 ('x'), but the schema's result 0 is another argument "
      "written in place");
  opreg::op("opreg_rel::writes_both(Tensor(a!) x, Tensor(b!) y) -> (Tensor(b!), Tensor(a!))")
      .fallback([](at::Tensor& x, at::Tensor& y) -> std::tuple<at::Tensor&, at::Tensor&> {
        return {y, x};
      })
      .define();
  EXPECT_CONTAINS(error_of([&] {
                    opreg::OpHandle<std::tuple<at::Tensor&, at::Tensor&>(at::Tensor&, at::Tensor&)>(
                        "opreg_rel::writes_both")(x, y);
                  }),
                  "result 0 is a Tensor reference in the handle's C++ signature, which PyTorch's "
                  "typed call returns as its argument 0 ('x')");
  opreg::op("opreg_rel::views_input(Tensor(a) x) -> Tensor(a)")
      .fallback([](const at::Tensor& x) { return x.view({-1}); })
      .define();
  EXPECT_CONTAINS(
      error_of([&] {
        opreg::OpHandle<const at::Tensor&(const at::Tensor&)>("opreg_rel::views_input")(x);
      }),
      "but the schema returns a view there, not an argument written in place");
  // As PyTorch reads them: an out argument last, and the results' outs last in order.
  opreg::op("opreg_rel::writes_out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
      .fallback([](const at::Tensor& x, at::Tensor& out) -> at::Tensor& { return out.copy_(x); })
      .define();
  at::Tensor out = at::zeros({1});
  at::Tensor& written =
      opreg::OpHandle<at::Tensor&(const at::Tensor&, at::Tensor&)>("opreg_rel::writes_out")(x, out);
  EXPECT_EQ(&written, &out);
  EXPECT_EQ(out.item<float>(), 2.0f);
  opreg::op("opreg_rel::writes_in_order(Tensor(a!) x, Tensor(b!) y) -> (Tensor(a!), Tensor(b!))")
      .fallback([](at::Tensor& x, at::Tensor& y) -> std::tuple<at::Tensor&, at::Tensor&> {
        return {x, y};
      })
      .define();
  auto both = opreg::OpHandle<std::tuple<at::Tensor&, at::Tensor&>(at::Tensor&, at::Tensor&)>(
      "opreg_rel::writes_in_order")(x, y);
  EXPECT_EQ(&std::get<0>(both), &x);
  EXPECT_EQ(&std::get<1>(both), &y);
}

// Sweep 52 B-N2: a replace to `-> int` published between a handle's check and its call gave an
// `at::ScalarType` handle an int beyond the enum (-96); such a result is refused after the call.
TEST(Reliability, AnEnumResultBeyondItsEnumIsRefused) {
  const auto out_of_range = static_cast<at::ScalarType>(static_cast<int8_t>(-96));
  EXPECT_CONTAINS(
      error_of([&] { opreg::detail::check_enum_result("opreg_rel::op", out_of_range); }),
      "opreg_rel::op: the call returned -96 for an enum result");
  EXPECT_CONTAINS(
      error_of([&] {
        opreg::detail::check_enum_result(
            "opreg_rel::op",
            std::make_tuple(at::ones({1}), std::optional<at::ScalarType>(out_of_range)));
      }),
      "which is no value of it");
  EXPECT_NO_THROW(opreg::detail::check_enum_result("opreg_rel::op", at::ScalarType::Float));
}

// Sweep 52 B-N11: one name twice in one define_all was said to be defined "by one of the kernel
// factories that build runs", though no factory ran.
TEST(Reliability, ANameTwiceInOneDefinitionIsSaidSo) {
  std::vector<opreg::OpBuilder> builders;
  for (int i = 0; i < 2; ++i) {
    opreg::OpBuilder builder("opreg_rel::named_twice(Tensor x) -> Tensor");
    builder.fallback(
        opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(twice)));
    builders.push_back(std::move(builder));
  }
  EXPECT_CONTAINS(error_of([&] { opreg::define_all(std::move(builders)); }),
                  "opreg_rel::named_twice: defined twice in one definition");
  EXPECT_FALSE(opreg::is_defined("opreg_rel::named_twice"));
}

// Sweep 52 B-N34: OPREG_DEBUG's fake check said a C++ fake's c10 error with c10's backtrace of
// opreg's own frames; a c10 error is said without it.
TEST(Reliability, AC10ErrorIsSaidWithoutItsBacktrace) {
  try {
    TORCH_CHECK(false, "said plainly");
  } catch (const c10::Error& error) {
    EXPECT_EQ(opreg::detail::message_of(error), "said plainly");
  }
}

// Sweep 54 B-N2: two arguments in the result's alias set: the schema does not say which the op
// returns, and the handle returned x where the op returned y.
TEST(Reliability, AHandleWhoseReferenceResultSharesItsAliasSetIsRefused) {
  opreg::op("opreg_rel::shared_set(Tensor(a!) x, Tensor(a!) y) -> Tensor(a!)")
      .fallback([](at::Tensor& x, at::Tensor& y) -> at::Tensor& { return y.add_(1); })
      .define();
  at::Tensor x = at::zeros({1}), y = at::zeros({1});
  EXPECT_CONTAINS(error_of([&] {
                    opreg::OpHandle<at::Tensor&(at::Tensor&, at::Tensor&)>("opreg_rel::shared_set")(
                        x, y);
                  }),
                  "but the schema gives its alias set to another argument too");
}

// Sweep 54 B-N7: a handle passing at::Layout where the schema declares ScalarType passed the
// check (both are ints), and the op read Layout::Sparse as ScalarType::Char.
TEST(Reliability, AHandlePassingAnotherEnumIsRefused) {
  opreg::op("opreg_rel::takes_dtype(Tensor x, ScalarType dtype) -> Tensor")
      .fallback([](const at::Tensor& x, at::ScalarType dtype) { return x.to(dtype); })
      .define();
  EXPECT_CONTAINS(error_of([] {
                    opreg::OpHandle<at::Tensor(const at::Tensor&, at::Layout)>(
                        "opreg_rel::takes_dtype")(at::ones({1}), at::kSparse);
                  }),
                  "argument 'dtype' is Layout in the handle's C++ signature but ScalarType in the "
                  "schema");
}
