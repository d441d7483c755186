// tests/cpp/test_errors.cpp: every user mistake gets a message naming the op, the argument, what
// was expected and what came; none crashes the process.
#include <torch/library.h>

#include <exception>
#include <typeinfo>

#include "opreg/detail/text.h"
#include "test_util.h"

using opreg_test::error_of;

namespace {

at::Tensor identity(const at::Tensor& x) { return x.clone(); }
at::Tensor add(const at::Tensor& x, const at::Tensor& y) { return x + y; }

// Sweep 21 B-F8: c10's errors from a backward, setup_context or a vmap rule did not say whose
// piece raised them; B-F7: the fallback's, after a kernel declined, were put on the kernel.
TEST(Errors, CTenErrorsOfPiecesNoKernelWrapsNameTheOp) {
  auto backward = opreg::op("opreg_err::c10_backward(Tensor x) -> Tensor")
                      .fallback(identity)
                      .backward([](opreg::AutogradContext&,
                                   const std::vector<at::Tensor>&) -> std::vector<at::Tensor> {
                        TORCH_CHECK(false, "c10 boom");
                      })
                      .define();
  auto x = at::ones({2}).requires_grad_();
  EXPECT_EQ(error_of([&] { backward(x).sum().backward(); }),
            "c10 boom (in backward of opreg_err::c10_backward)");
  auto setup = opreg::op("opreg_err::c10_setup(Tensor x) -> Tensor")
                   .fallback(identity)
                   .backward([](opreg::AutogradContext&,
                                const std::vector<at::Tensor>& grads) { return grads; },
                             [](opreg::AutogradContext&, const std::vector<c10::IValue>&,
                                const std::vector<c10::IValue>&) { TORCH_CHECK(false, "set up"); })
                   .define();
  EXPECT_EQ(error_of([&] { setup(x); }), "set up (in setup_context of opreg_err::c10_setup)");
  auto declined =
      opreg::op("opreg_err::declined(Tensor x) -> Tensor")
          .fallback([](const at::Tensor& x) { return x + at::ones({3}); })
          .kernel(identity,
                  opreg::on({"cpu"}).name("never").accepts([](const at::Tensor&) { return false; }))
          .define();
  EXPECT_CONTAINS(error_of([&] { declined(at::ones({2})); }),
                  "(in the fallback of opreg_err::declined, which served the call kernel:never "
                  "declined)");
}

// The fifth sweep: exceptions that are not c10::Errors lost the op's name.
TEST(Errors, WhatUserCodeThrowsNamesTheOpAndThePiece) {
  auto op = opreg::op("opreg_err::throws(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) -> at::Tensor {
                  if (x.numel() == 1) throw std::logic_error("logic!");
                  throw 42;
                })
                .kernel([](const at::Tensor& x) { return x; },
                        opreg::on({"cpu"}).name("picky").accepts([](const at::Tensor& x) -> bool {
                          if (x.numel() == 3) throw std::runtime_error("accepts threw");
                          return false;
                        }))
                .define();
  EXPECT_EQ(error_of([&] { op(at::ones({1})); }), "opreg_err::throws: fallback threw: logic!");
  EXPECT_EQ(error_of([&] { op(at::ones({2})); }),
            "opreg_err::throws: fallback threw something that is not a std::exception");
  EXPECT_EQ(error_of([&] { op(at::ones({3})); }),
            "opreg_err::throws: the accepts predicate of kernel:picky threw: accepts threw");
  // Sweep 38 B-F3: the standard library's bad_* errors passed unnamed ("bad optional access").
  auto optional =
      opreg::op("opreg_err::optional_value(Tensor x, int? n) -> Tensor")
          .fallback([](const at::Tensor& x, std::optional<int64_t> n) { return x * n.value(); })
          .define();
  EXPECT_CONTAINS(error_of([&] { optional(at::ones({1}), std::nullopt); }),
                  "opreg_err::optional_value: fallback threw: bad optional access");
  // Sweep 39 B-F5: and the two the fix left out.
  auto typeid_of_null = opreg::op("opreg_err::typeid_of_null(Tensor x) -> Tensor")
                            .fallback([](const at::Tensor& x) -> at::Tensor {
                              if (x.numel() == 1) throw std::bad_typeid();  // typeid(*null)'s
                              throw std::bad_exception();
                            })
                            .define();
  EXPECT_CONTAINS(error_of([&] { typeid_of_null(at::ones({1})); }),
                  "opreg_err::typeid_of_null: fallback threw: std::bad_typeid");
  EXPECT_CONTAINS(error_of([&] { typeid_of_null(at::ones({2})); }),
                  "opreg_err::typeid_of_null: fallback threw: std::bad_exception");
  // Other std::exceptions (Python's errors coming back through the dispatcher, say) pass as is.
  struct Passing : std::exception {
    const char* what() const noexcept override { return "passing"; }
  };
  EXPECT_THROW(opreg::op("opreg_err::passes(Tensor x) -> Tensor")
                   .fallback([](const at::Tensor&) -> at::Tensor { throw Passing(); })
                   .define()(at::ones({1})),
               Passing);
  EXPECT_THROW(opreg::op("opreg_err::oom(Tensor x) -> Tensor")
                   .fallback([](const at::Tensor&) -> at::Tensor { throw std::bad_alloc(); })
                   .define()(at::ones({1})),
               std::bad_alloc);
}

// The fifth sweep: a handle whose signature does not fit the schema (here the returns) got a
// PyTorch internal assert when the call's result was unboxed.
// Fourteenth sweep: a C++ piece's what() with a 0xff byte raised UnicodeDecodeError in Python.
TEST(Errors, AThrowOfBytesThatAreNotUtf8IsEscaped) {
  EXPECT_EQ(opreg::detail::valid_utf8("a\xff b\xc3"), "a\\xff b\\xc3");
  EXPECT_EQ(opreg::detail::valid_utf8("caf\xc3\xa9 \xed\xa0\x80"), "caf\xc3\xa9 \\xed\\xa0\\x80");
  opreg::op("opreg_errors::bytes(Tensor x) -> Tensor")
      .fallback([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("bad \xff"); })
      .define();
  EXPECT_CONTAINS(error_of([] { opreg_test::call_boxed("opreg_errors::bytes", {at::ones({1})}); }),
                  "opreg_errors::bytes: fallback threw: bad \\xff");
}

// Sweep 32 B-F13: a c10 error of the user's with bytes that are not UTF-8 passed as it was, and
// Python could not decode it. It keeps its type; its message and context are escaped.
TEST(Errors, ACTenErrorOfBytesThatAreNotUtf8KeepsItsType) {
  auto op = opreg::op("opreg_errors::c10_bytes(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) -> at::Tensor {
                  TORCH_CHECK_INDEX(x.numel() != 1, "index \xfe");
                  c10::ValueError error("value \xfe", nullptr, nullptr);
                  error.add_context("context \xfd");
                  throw error;
                })
                .define();
  try {
    op(at::ones({1}));
    ADD_FAILURE() << "no error";
  } catch (const c10::IndexError& error) {
    EXPECT_EQ(error.msg(), "index \\xfe");
  }
  try {
    op(at::ones({2}));
    ADD_FAILURE() << "no error";
  } catch (const c10::ValueError& error) {
    EXPECT_EQ(error.msg(), "value \\xfe");
    ASSERT_FALSE(error.context().empty());
    EXPECT_EQ(error.context()[0], "context \\xfd");
  }
}

TEST(Errors, AHandleWithTheWrongSignatureNamesTheOp) {
  opreg::op("opreg_err::one_out(Tensor x) -> Tensor").fallback(identity).define();
  opreg::OpHandle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&)> two_outs(
      "opreg_err::one_out");
  auto message = error_of([&] { two_outs(at::ones({1})); });
  EXPECT_EQ(message.rfind("opreg: op 'opreg_err::one_out': the handle's C++ signature does not "
                          "match the schema",
                          0),
            0u)
      << message;
  EXPECT_NE(message.find("the schema is 'opreg_err::one_out(Tensor x) -> Tensor'"),
            std::string::npos)
      << message;
  opreg::OpHandle<at::Tensor(double)> wrong_argument("opreg_err::one_out");
  message = error_of([&] { wrong_argument(1.0); });
  EXPECT_NE(message.find("the handle's C++ signature does not match the schema"), std::string::npos)
      << message;
  opreg::OpHandle<at::Tensor(const at::Tensor&)> right("opreg_err::one_out");
  EXPECT_TRUE(right(at::ones({2})).equal(at::ones({2})));
}

TEST(Errors, BadSchemaNamesTheOpAndThePosition) {
  auto message = error_of(
      [] { opreg::op("opreg_err::bad(Tensor x, Tensr y) -> Tensor").fallback(add).define(); });
  EXPECT_CONTAINS(message, "opreg_err::bad");
  EXPECT_CONTAINS(message, "cannot parse schema");
  EXPECT_CONTAINS(message, "Tensr");
  EXPECT_CONTAINS(message, "HERE");  // the parser marks the position
  // Sweep 30 B-F5: a float default out of a double's range was said to be an int.
  EXPECT_CONTAINS(error_of([] {
                    opreg::op("opreg_err::huge(Tensor x, float f=1e999) -> Tensor")
                        .fallback([](const at::Tensor& x, double) { return x.clone(); })
                        .define();
                  }),
                  "a number in it is out of range (an int default must fit in 64 bits; a float "
                  "default must be 0 or of a double's size, 2.2e-308 to 1.8e308)");
}

TEST(Errors, NameWithoutNamespace) {
  auto message =
      error_of([] { opreg::op("lonely(Tensor x) -> Tensor").fallback(identity).define(); });
  EXPECT_CONTAINS(message, "'lonely' has no namespace");
}

TEST(Errors, FallbackSignatureDoesNotMatchTheSchema) {
  auto message = error_of([] {
    opreg::op("opreg_err::arity(Tensor x, Tensor y) -> Tensor").fallback(identity).define();
  });
  EXPECT_CONTAINS(message, "opreg_err::arity");
  EXPECT_CONTAINS(message, "fallback");
  EXPECT_FALSE(opreg::is_defined("opreg_err::arity"));
  EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({"opreg_err::arity", ""}).has_value());
}

TEST(Errors, DefiningTwiceNamesTheEarlierOrigin) {
  opreg::op("opreg_err::twice(Tensor x) -> Tensor").fallback(identity).define();
  auto message = error_of(
      [] { opreg::op("opreg_err::twice(Tensor x) -> Tensor").fallback(identity).define(); });
  EXPECT_CONTAINS(message, "opreg_err::twice: an op of this name is already defined (by ");
  EXPECT_CONTAINS(message, "opreg_cpp_tests");
  EXPECT_CONTAINS(message, "replace");
}

TEST(Errors, AnOpDefinedOutsideOpregCannotBeReplaced) {
  static torch::Library outside(torch::Library::FRAGMENT, "opreg_outside", std::nullopt, __FILE__,
                                __LINE__);
  outside.def("op(Tensor x) -> Tensor");
  auto message = error_of([] {
    opreg::op("opreg_outside::op(Tensor x) -> Tensor").fallback(identity).replace().define();
  });
  EXPECT_CONTAINS(message,
                  "opreg_outside::op: an op of this name is already defined outside opreg");
}

TEST(Errors, PyTorchsNamespacesAreRefused) {
  auto message = error_of([] {
    opreg::op("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor")
        .fallback([](const at::Tensor& a, const at::Tensor& b, const c10::Scalar&) { return a; })
        .replace()
        .define();
  });
  EXPECT_CONTAINS(message, "the namespace 'aten' belongs to PyTorch");
}

TEST(Errors, WrongDtypeNamesTheArgument) {
  auto op = opreg::op("opreg_err::float_only(Tensor x, Tensor y) -> Tensor")
                .fallback(add)
                .dtypes("y", {at::kFloat, at::kDouble})
                .define();
  auto message = error_of([&] { op(at::ones({2}), at::ones({2}, at::kInt)); });
  EXPECT_CONTAINS(
      message, "opreg_err::float_only: argument 'y' has dtype Int, expected one of: Float, Double");
}

TEST(Errors, DtypesForAnUnknownArgument) {
  auto message = error_of([] {
    opreg::op("opreg_err::unknown_arg(Tensor x) -> Tensor")
        .fallback(identity)
        .dtypes("z", {at::kFloat})
        .define();
  });
  EXPECT_CONTAINS(message, "dtypes() names argument 'z', which the schema");
}

TEST(Errors, ZeroDimCpuTensorsMixWithOtherDevices) {
  auto op = opreg::op("opreg_err::scalar_mix(Tensor x, Tensor y) -> Tensor").fallback(add).define();
  auto out = op(at::empty({2}, at::device(at::kMeta)), at::scalar_tensor(1.0));
  EXPECT_TRUE(out.is_meta());
}

TEST(Errors, FallbackThatCannotRunOnMetaAsksForAFake) {
  auto op = opreg::op("opreg_err::needs_data(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) { return x * x.sum().item<double>(); })
                .define();
  auto message = error_of([&] { op(at::empty({3}, at::device(at::kMeta))); });
  EXPECT_CONTAINS(message, "opreg_err::needs_data: has no fake, and its fallback failed on meta");
  EXPECT_CONTAINS(message, ".fake(fn)");
}

TEST(Errors, KernelForMetaIsRefused) {
  auto message = error_of([] {
    opreg::op("opreg_err::meta_kernel(Tensor x) -> Tensor")
        .fallback(identity)
        .kernel(identity, opreg::on({"meta"}))
        .define();
  });
  EXPECT_CONTAINS(message, "lists device type 'meta'");
}

// The sixth sweep: these were accepted, the kernel serving nothing (recorded as skipped, or not
// at all), where the Python fronts refuse them.
TEST(Errors, KernelsListingNoDeviceTypeAreRefused) {
  for (const std::vector<std::string>& types :
       {std::vector<std::string>{}, {"cuda:0"}, {""}, {"cpu", " "}}) {
    auto message = error_of([&] {
      opreg::op("opreg_err::no_device_type(Tensor x) -> Tensor")
          .fallback(identity)
          .kernel(identity, opreg::on(types).name("k"))
          .define();
    });
    EXPECT_EQ(message.rfind("opreg_err::no_device_type: kernel 'k' lists ", 0), 0u) << message;
  }
  EXPECT_THROW(opreg::describe_op("opreg_err::no_device_type"), c10::ValueError);
}

TEST(Errors, TwoKernelsForOneDeviceType) {
  auto message = error_of([] {
    opreg::op("opreg_err::two_kernels(Tensor x) -> Tensor")
        .fallback(identity)
        .kernel(identity, opreg::on({"cpu"}).name("first"))
        .kernel(identity, opreg::on({"cpu"}).name("second"))
        .define();
  });
  EXPECT_CONTAINS(message, "kernels 'first' and 'second' both serve device type 'cpu'");
  EXPECT_FALSE(opreg::is_defined("opreg_err::two_kernels"));
}

TEST(Errors, DescribingAnUnknownOp) {
  auto message = error_of([] { opreg::describe_op("opreg_err::never_defined"); });
  EXPECT_CONTAINS(message, "no op named 'opreg_err::never_defined'");
}

}  // namespace

// Sweep 28 B-F2: the length of an int[N] was checked neither in a default nor in a call, so a
// fallback that trusts the schema read past the end of a shorter list.
TEST(Errors, AListOfADeclaredLengthIsCheckedInItsDefaultAndInACall) {
  auto first = [](const at::Tensor& x, c10::IntArrayRef k) { return x + k[0] + k[1]; };
  EXPECT_EQ(error_of([&] {
              opreg::op("opreg_err::long_default(Tensor x, int[2] k=[1,2,3]) -> Tensor")
                  .fallback(first)
                  .define();
            }),
            "opreg: op 'opreg_err::long_default': argument 'k' has a default of 3 elements, "
            "expected 2 (schema 'opreg_err::long_default(Tensor x, int[2] k=[1,2,3]) -> Tensor')");
  EXPECT_FALSE(opreg::is_defined("opreg_err::long_default"));
  opreg::op("opreg_err::pair(Tensor x, int[2] k=1) -> Tensor").fallback(first).define();
  auto call = [](std::vector<int64_t> k) {
    return opreg_test::call_boxed("opreg_err::pair", {at::zeros({1}), c10::IValue(k)});
  };
  EXPECT_EQ(call({2, 3})[0].toTensor().item<float>(), 5.0F);
  for (const std::vector<int64_t>& k : {std::vector<int64_t>{}, std::vector<int64_t>{9, 8, 7}}) {
    EXPECT_EQ(error_of([&] { call(k); }),
              "opreg_err::pair: argument 'k' has " + std::to_string(k.size()) +
                  " elements, expected 2 (schema 'opreg_err::pair(Tensor x, int[2] k=1) -> "
                  "Tensor')");
  }
}

// Sweep 40 B-F2: a kernel factory that kept KernelContext::fallback past a replace of its op
// called freed memory (the fallback held its definition by a raw pointer).
TEST(Errors, AFallbackKeptPastItsDefinitionIsRefusedNamingTheOp) {
  static std::shared_ptr<const c10::KernelFunction> kept;
  auto plus = [](double value) {
    return opreg::KernelFactory{[value](const opreg::KernelContext& context) {
      if (context.fallback != nullptr) kept = context.fallback;
      return c10::KernelFunction::makeFromUnboxedLambda(
          [value](const at::Tensor& x) { return x + value; });
    }};
  };
  opreg::OpBuilder builder("opreg_err::kept_fallback(Tensor x) -> Tensor");
  builder.fallback(plus(1)).kernel(plus(2), "k", std::vector<std::string>{"cpu"});
  std::move(builder).define();
  const auto handle =
      c10::Dispatcher::singleton().findSchemaOrThrow("opreg_err::kept_fallback", "");
  ASSERT_NE(kept, nullptr);
  auto call_kept = [&] {
    return kept->call<at::Tensor, const at::Tensor&>(handle, {}, at::zeros({1})).item<float>();
  };
  EXPECT_EQ(call_kept(), 1.0F);
  opreg::op("opreg_err::kept_fallback(Tensor x) -> Tensor").fallback(identity).replace().define();
  EXPECT_CONTAINS(error_of(call_kept),
                  "opreg_err::kept_fallback: the fallback of a definition that was replaced or "
                  "undefined was called");
  kept.reset();
  opreg::undefine("opreg_err::kept_fallback");
}

// Sweep 39 B-F6: a NUL in part_of's owner ended the message there ("part_of('b09::ow").
TEST(Errors, APartOfOwnerHoldingANulIsNamedWhole) {
  auto message = error_of([] {
    opreg::op("opreg_err::nul_owner(Tensor x) -> Tensor")
        .fallback(identity)
        .part_of(std::string("opreg_err::ow\0ner", 17))
        .define();
  });
  EXPECT_CONTAINS(message, "opreg_err::nul_owner: part_of('opreg_err::ow\\x00ner') names no op");
  EXPECT_FALSE(opreg::is_defined("opreg_err::nul_owner"));
}

// Sweep 28 B-F5: two ops each part of the other were defined; each undefine then named the other.
TEST(Errors, APartOfItsOwnPartIsRefused) {
  auto part = [](const std::string& name, const std::string& owner) {
    opreg::OpBuilder builder(name + "(Tensor x) -> Tensor");
    builder.fallback(
        opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(identity)));
    builder.part_of(owner);
    return builder;
  };
  std::vector<opreg::OpBuilder> builders;
  builders.push_back(part("opreg_err::cycle_a", "opreg_err::cycle_b"));
  builders.push_back(part("opreg_err::cycle_b", "opreg_err::cycle_a"));
  EXPECT_EQ(error_of([&] { opreg::define_all(std::move(builders)); }),
            "opreg_err::cycle_a: part_of('opreg_err::cycle_b') makes a cycle (opreg_err::cycle_a "
            "is part of opreg_err::cycle_b is part of opreg_err::cycle_a): an op cannot be part of "
            "one of its own parts");
  EXPECT_FALSE(opreg::is_defined("opreg_err::cycle_a"));
  EXPECT_FALSE(opreg::is_defined("opreg_err::cycle_b"));
  // Through a defined op: its part, defined again as its owner.
  opreg::op("opreg_err::owner(Tensor x) -> Tensor").fallback(identity).define();
  opreg::op("opreg_err::part(Tensor x) -> Tensor")
      .fallback(identity)
      .part_of("opreg_err::owner")
      .define();
  EXPECT_CONTAINS(error_of([&] {
                    opreg::op("opreg_err::owner(Tensor x) -> Tensor")
                        .fallback(identity)
                        .part_of("opreg_err::part")
                        .replace()
                        .define();
                  }),
                  "makes a cycle (opreg_err::owner is part of opreg_err::part is part of "
                  "opreg_err::owner)");
  opreg::undefine("opreg_err::owner");
  EXPECT_FALSE(opreg::is_defined("opreg_err::part"));
}

// Sweep 28 B-F6: a str output that is not UTF-8 reached Python, which failed to decode it without
// naming the op.
TEST(Errors, AStrOutputThatIsNotUtf8IsRefused) {
  auto op = opreg::op("opreg_err::bytes(Tensor x) -> str")
                .fallback([](const at::Tensor& x) -> std::string {
                  return x.numel() == 1 ? "caf\xc3\xa9"
                                        : "a\xff\xfe"
                                          "b";
                })
                .define();
  EXPECT_EQ(op(at::ones({1})), "caf\xc3\xa9");
  EXPECT_EQ(error_of([&] { op(at::ones({2})); }),
            "opreg_err::bytes: the fallback returned a str for output 0 that is not UTF-8 "
            "('a\\xff\\xfeb'), which Python cannot read (schema 'opreg_err::bytes(Tensor x) -> "
            "str')");
}

// Sweep 29 B-F4, B-F5: an int[N] output's length and a str[] output's elements were not checked
// (a str that is not UTF-8 reached Python's decoder, which named neither the op nor the output).
TEST(Errors, OutputsOfADeclaredLengthAndStrListsAreChecked) {
  auto pair = opreg::op("opreg_err::int_pair(Tensor x) -> int[2]")
                  .fallback([](const at::Tensor& x) {
                    return std::vector<int64_t>(static_cast<size_t>(x.numel()), 7);
                  })
                  .define();
  EXPECT_EQ(pair(at::ones({2})), (std::vector<int64_t>{7, 7}));
  EXPECT_EQ(error_of([&] { pair(at::ones({3})); }),
            "opreg_err::int_pair: the fallback returned 3 elements for output 0, expected 2 "
            "(schema 'opreg_err::int_pair(Tensor x) -> int[2]')");
  auto words = opreg::op("opreg_err::words(Tensor x) -> str[]")
                   .fallback([](const at::Tensor& x) {
                     return std::vector<std::string>{"ok", x.numel() == 1 ? "fine" : "a\xff"};
                   })
                   .define();
  EXPECT_EQ(words(at::ones({1})), (std::vector<std::string>{"ok", "fine"}));
  EXPECT_EQ(error_of([&] { words(at::ones({2})); }),
            "opreg_err::words: the fallback returned a str for output 0 at element 1 that is not "
            "UTF-8 ('a\\xff'), which Python cannot read (schema 'opreg_err::words(Tensor x) -> "
            "str[]')");
  // Sweep 30 B-F1: an optional list of str, and a list of optional str, were not checked.
  auto maybe_words = opreg::op("opreg_err::maybe_words(Tensor x) -> str[]?")
                         .fallback([](const at::Tensor& x) {
                           return std::optional<std::vector<std::string>>(
                               std::vector<std::string>{"ok", x.numel() == 1 ? "fine" : "a\xff"});
                         })
                         .define();
  EXPECT_EQ(maybe_words(at::ones({1})), (std::vector<std::string>{"ok", "fine"}));
  EXPECT_CONTAINS(error_of([&] { maybe_words(at::ones({2})); }),
                  "opreg_err::maybe_words: the fallback returned a str for output 0 at element 1 "
                  "that is not UTF-8 ('a\\xff')");
  auto some_words = opreg::op("opreg_err::some_words(Tensor x) -> str?[]")
                        .fallback([](const at::Tensor& x) {
                          return c10::List<std::optional<std::string>>(
                              {std::nullopt, x.numel() == 1 ? "fine" : "a\xff"});
                        })
                        .define();
  EXPECT_EQ(some_words(at::ones({1})).get(1)->get(), "fine");
  EXPECT_CONTAINS(error_of([&] { some_words(at::ones({2})); }),
                  "opreg_err::some_words: the fallback returned a str for output 0 at element 1 "
                  "that is not UTF-8 ('a\\xff')");
}

// Sweep 29 A-F3, B-F1, B-F2: the fallback run on meta tensors gave 'meta' for a Device output,
// which FakeTensorMode passed on as the op's device: such a fallback serves as no fake.
TEST(Errors, AFallbackWithADeviceOutputServesAsNoFake) {
  auto where = opreg::op("opreg_err::where(Tensor x) -> (Tensor, Device?)")
                   .fallback([](const at::Tensor& x) {
                     return std::make_tuple(x.clone(), std::optional<c10::Device>(x.device()));
                   })
                   .define();
  EXPECT_EQ(std::get<1>(where(at::ones({2}))), c10::Device("cpu"));
  // Sweep 30 B-F4: a handle of an op with a Device output did not compile.
  opreg::op("opreg_err::device_of(Tensor x) -> (Tensor, Device)")
      .fallback([](const at::Tensor& x) { return std::make_tuple(x.clone(), x.device()); })
      .define();
  const opreg::OpHandle<std::tuple<at::Tensor, c10::Device>(const at::Tensor&)> device_of(
      "opreg_err::device_of");
  EXPECT_EQ(std::get<1>(device_of(at::ones({2}))), c10::Device("cpu"));
  EXPECT_CONTAINS(error_of([&] { where(at::ones({2}, at::kMeta)); }),
                  "opreg_err::where: has no fake, and its fallback run on meta tensors would give "
                  "'meta' for the Device of output 1");
}

// Sweep 32 B-F4: a boxed fallback (a KernelFactory's) pushed any kind for a non-tensor output:
// Python read it as it was ('-> int' gave a str), a typed caller met an internal assert.
c10::IValue pushed_output;  // NOLINT: what the boxed fallback below pushes
void push_the_output(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  stack->clear();
  stack->push_back(pushed_output);
}

TEST(Errors, ABoxedFallbacksOutputOfAnotherKindIsRefused) {
  const std::vector<std::tuple<std::string, c10::IValue, std::string>> cases{
      {"int", std::string("str"), "returned String for output 0, expected int"},
      {"Device", 2.5, "returned Double for output 0, expected Device"},
      {"Tensor[]", at::ones({1}), "returned Tensor for output 0, expected Tensor[]"},
      {"complex", 2.5, "returned Double for output 0, expected complex"},
      {"SymInt[]", c10::List<double>({1.5}), "returned float[] for output 0, expected SymInt[]"},
      {"int", int64_t{3}, ""},
      {"complex", c10::complex<double>(1, 2), ""},
      {"Scalar", c10::complex<double>(1, 2), ""},
      {"ScalarType", int64_t{6}, ""},
      {"SymInt[]", c10::List<int64_t>({1, 2}), ""},
  };
  for (const auto& [type, value, message] : cases) {
    const std::string name = "opreg_err::pushes_" + std::to_string(&type - &std::get<0>(cases[0]));
    opreg::OpBuilder builder(name + "(Tensor x) -> " + type);
    builder.fallback(opreg::KernelFactory{[](const opreg::KernelContext&) {
      return c10::KernelFunction::makeFromBoxedFunction<&push_the_output>();
    }});
    std::move(builder.replace()).define();
    pushed_output = value;
    if (message.empty()) {
      EXPECT_NO_THROW(opreg_test::call_boxed(name, {at::ones({1})})) << type;
    } else {
      EXPECT_CONTAINS(error_of([&] { opreg_test::call_boxed(name, {at::ones({1})}); }),
                      name + ": the fallback " + message);
    }
  }
}

// Sweep 32 B-F7: a boxed call's complex or SymInt[] argument of another kind met PyTorch's
// internal assert in the fallback's unboxing.
TEST(Errors, ABoxedCallsComplexAndSymIntListArgumentsAreChecked) {
  opreg::op("opreg_err::rotate(Tensor x, complex c, SymInt[] size) -> Tensor")
      .fallback([](const at::Tensor& x, c10::complex<double> c, c10::SymIntArrayRef) {
        return x * c.real();
      })
      .define();
  EXPECT_CONTAINS(error_of([] {
                    opreg_test::call_boxed("opreg_err::rotate",
                                           {at::ones({1}), 2.5, c10::List<int64_t>({1})});
                  }),
                  "opreg_err::rotate: argument 'c' must be complex, got Double");
  EXPECT_CONTAINS(error_of([] {
                    opreg_test::call_boxed(
                        "opreg_err::rotate",
                        {at::ones({1}), c10::complex<double>(2, 0), c10::List<double>({1.5})});
                  }),
                  "opreg_err::rotate: argument 'size' must be SymInt[], got float[]");
  EXPECT_NO_THROW(opreg_test::call_boxed(
      "opreg_err::rotate", {at::ones({1}), c10::complex<double>(2, 0), c10::List<int64_t>({1})}));
}

// Sweep 32 B-F3: a C++ op's python_fake("module") never took effect (Python's register_fake
// refuses a piece for an op C++ defines): the op ran its fallback on meta tensors instead. Sweep
// 33 B-F5: python_fake("opreg._declaration"), the one module taken, did the same while the op's
// report said it had a Python fake. It is the Python front's alone now.
template <class Builder, class = void>
struct HasPublicPythonFake : std::false_type {};
template <class Builder>
struct HasPublicPythonFake<Builder,
                           std::void_t<decltype(std::declval<Builder&>().python_fake("m"))>>
    : std::true_type {};

TEST(Errors, APythonFakeIsNotGivenFromCpp) {
  static_assert(!HasPublicPythonFake<opreg::OpBuilder>::value,
                "python_fake is the Python front's alone: from C++ it never takes effect");
}

// Sweep 32 A-F5: the fallback's error on meta tensors, quoted with the backtrace of an error
// rethrown inside it, carried a library path that was not UTF-8: Python could not read the message.
TEST(Errors, AFallbacksErrorOnMetaIsQuotedWithoutBacktraceAsUtf8) {
  auto quoted = opreg::op("opreg_err::quoted(Tensor x) -> Tensor")
                    .fallback([](const at::Tensor& x) -> at::Tensor {
                      if (!x.is_meta()) return x.clone();
                      throw std::runtime_error(
                          "cannot run on meta in ops\xfe.so\nException raised from run at "
                          "ops\xfe.so:1");
                    })
                    .define();
  const auto message = error_of([&] { quoted(at::ones({2}, at::kMeta)); });
  EXPECT_CONTAINS(message,
                  "opreg_err::quoted: has no fake, and its fallback failed on meta tensors; give "
                  "the op a fake (.fake(fn) in C++, fake_fn= in Python). The fallback said: "
                  "opreg_err::quoted: fallback(meta) threw: cannot run on meta in ops\\xfe.so");
  EXPECT_EQ(message.find("Exception raised from run"), std::string::npos) << message;
}

// Sweep 29 B-F8: a schema reading that threw a std::exception left define() bare.
TEST(Errors, ASchemaReadingThatThrowsNamesTheOp) {
  opreg::OpBuilder builder("opreg_err::unread");
  builder.fallback(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(identity)));
  builder.infer_schema([]() -> c10::FunctionSchema { throw std::runtime_error("cannot read"); });
  EXPECT_EQ(error_of([&] { std::move(builder).define(); }),
            "opreg: op 'opreg_err::unread': its infer_schema (its schema read from a C++ "
            "signature) threw: cannot read");
  EXPECT_FALSE(opreg::is_defined("opreg_err::unread"));
}

// Sweep 53 B-N7: what is not a std::exception reached define()'s caller as it was, and a c10
// error named no op.
TEST(Errors, ASchemaReadingThatThrowsAnythingNamesTheOp) {
  opreg::OpBuilder thrown_text("opreg_err::unread_text");
  thrown_text.fallback(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(identity)));
  thrown_text.infer_schema([]() -> c10::FunctionSchema { throw std::string("a string"); });
  EXPECT_EQ(error_of([&] { std::move(thrown_text).define(); }),
            "opreg: op 'opreg_err::unread_text': its infer_schema (its schema read from a C++ "
            "signature) threw something that is not a std::exception");
  opreg::OpBuilder c10_error("opreg_err::unread_c10");
  c10_error.fallback(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(identity)));
  c10_error.infer_schema([]() -> c10::FunctionSchema { TORCH_CHECK(false, "no schema here"); });
  EXPECT_CONTAINS(error_of([&] { std::move(c10_error).define(); }),
                  "in infer_schema of opreg_err::unread_c10");
  EXPECT_FALSE(opreg::is_defined("opreg_err::unread_text"));
  EXPECT_FALSE(opreg::is_defined("opreg_err::unread_c10"));
}

// Sweep 35 B-F3: a piece taking other C++ arguments than the schema's was accepted, and every
// call met PyTorch's internal assert "expected int".
TEST(Errors, APieceOfAnotherCppSignatureIsRefusedAtItsDefinition) {
  using Wrong = std::function<at::Tensor(const at::Tensor&, int64_t)>;
  const Wrong add = [](const at::Tensor& x, int64_t n) { return x + n; };
  opreg::OpBuilder fallback("opreg_err::piece_signature(Tensor x) -> Tensor");
  fallback.fallback(opreg::detail::typed_kernel(add));
  EXPECT_CONTAINS(error_of([&] { std::move(fallback).define(); }),
                  "opreg_err::piece_signature: its fallback's C++ signature does not match the "
                  "schema: The number of arguments is different. 2 vs 1.");
  opreg::OpBuilder kernel("opreg_err::piece_signature(Tensor x) -> Tensor");
  kernel
      .fallback(opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(identity)))
      .kernel(opreg::detail::typed_kernel(add), "cpu", std::vector<std::string>{"cpu"});
  EXPECT_CONTAINS(error_of([&] { std::move(kernel).define(); }),
                  "opreg_err::piece_signature: its kernel:cpu's C++ signature does not match");
  EXPECT_FALSE(opreg::is_defined("opreg_err::piece_signature"));
}

// Sweep 36 B-F5: a kernel or fake taking an int for the schema's int (int64_t) was accepted, and
// std::function cut the argument on the way in.
at::Tensor scaled(const at::Tensor& x, int64_t n) { return x.mul(n); }
using ScaledSignature = at::Tensor(const at::Tensor&, int64_t);
static_assert(opreg::detail::takes_the_scalars_of<ScaledSignature, decltype(&scaled)>());
static_assert(!opreg::detail::takes_the_scalars_of<
              ScaledSignature, std::function<at::Tensor(const at::Tensor&, int)>>());
static_assert(
    !opreg::detail::takes_the_scalars_of<at::Tensor(const at::Tensor&, double),
                                         std::function<at::Tensor(const at::Tensor&, float)>>());
static_assert(!opreg::detail::takes_the_scalars_of<
              ScaledSignature, std::function<at::Tensor(const at::Tensor&, bool)>>());
// Sweep 37 B-F1: the same through an optional or a list (`int? n`, `float[] a`), and for an
// accepts() predicate; a list of tensors, a string view and references stay accepted.
using OptionalSignature = at::Tensor(const at::Tensor&, std::optional<int64_t>,
                                     c10::ArrayRef<double>);
static_assert(opreg::detail::takes_the_scalars_of<
              OptionalSignature, std::function<at::Tensor(at::Tensor, const std::optional<int64_t>&,
                                                          std::vector<double>)>>());
static_assert(
    !opreg::detail::takes_the_scalars_of<
        OptionalSignature,
        std::function<at::Tensor(const at::Tensor&, std::optional<int>, c10::ArrayRef<double>)>>());
static_assert(!opreg::detail::takes_the_scalars_of<
              OptionalSignature, std::function<at::Tensor(const at::Tensor&, std::optional<int64_t>,
                                                          std::vector<float>)>>());
static_assert(!opreg::detail::takes_the_scalars_of<
              at::Tensor(const at::Tensor&, double),
              std::function<at::Tensor(const at::Tensor&, std::optional<float>)>>());
static_assert(opreg::detail::takes_the_scalars_of<
              at::Tensor(at::TensorList, c10::string_view),
              std::function<at::Tensor(const std::vector<at::Tensor>&, std::string)>>());
static_assert(
    !opreg::detail::takes_the_scalars_of<ScaledSignature, bool (*)(const at::Tensor&, int)>());
// Sweep 38 B-F2, B-F5: the return too (an int output returned as a double was cut), a tuple's
// element by element; and a kernel given as std::ref(kernel).
static_assert(!opreg::detail::takes_the_scalars_of<int64_t(const at::Tensor&),
                                                   std::function<double(const at::Tensor&)>>());
static_assert(!opreg::detail::takes_the_scalars_of<
              std::tuple<at::Tensor, double>(const at::Tensor&),
              std::function<std::tuple<at::Tensor, float>(const at::Tensor&)>>());
static_assert(opreg::detail::takes_the_scalars_of<
              std::tuple<at::Tensor, double>(const at::Tensor&),
              std::function<std::tuple<at::Tensor, double>(at::Tensor)>>());
// Sweep 39 B-F3: a std::pair, which converts to a tuple of two.
static_assert(!opreg::detail::takes_the_scalars_of<
              std::tuple<at::Tensor, int64_t>(const at::Tensor&),
              std::function<std::pair<at::Tensor, double>(const at::Tensor&)>>());
static_assert(opreg::detail::takes_the_scalars_of<
              std::tuple<at::Tensor, int64_t>(const at::Tensor&),
              std::function<std::pair<at::Tensor, int64_t>(const at::Tensor&)>>());
using NarrowKernel = at::Tensor (*)(const at::Tensor&, int);
static_assert(
    !opreg::detail::takes_the_scalars_of<ScaledSignature, std::reference_wrapper<NarrowKernel>>());

// Sweep 36 B-F6: a kernel name of bytes that are not UTF-8 was accepted, and describe_op's report
// then could not reach Python.
TEST(Errors, AKernelNameThatIsNotTextIsRefused) {
  auto message = error_of([] {
    opreg::op("opreg_err::kernel_bytes(Tensor x) -> Tensor")
        .fallback(identity)
        .kernel(identity, opreg::on({"cpu"}).name("k\xff"))
        .define();
  });
  EXPECT_CONTAINS(message,
                  "opreg_err::kernel_bytes: kernel name 'k\\xff' holds bytes that are not");
  EXPECT_FALSE(opreg::is_defined("opreg_err::kernel_bytes"));
}

// Sweep 37 B-F4: a boxed call giving a List<Tensor> for a Tensor?[] met PyTorch's "Tried to cast a
// List<Tensor> to a List<Tensor?>", blamed on the fallback; the pieces get a List<Tensor?>.
TEST(Errors, ABoxedListOfTensorsServesATensorOptionalList) {
  opreg::op("opreg_err::count_given(Tensor?[] xs) -> int")
      .fallback([](const c10::List<std::optional<at::Tensor>>& xs) {
        int64_t given = 0;
        for (const std::optional<at::Tensor>& x : xs) given += x.has_value() ? 1 : 0;
        return given;
      })
      .define();
  const c10::List<at::Tensor> tensors({at::ones({1}), at::ones({2})});
  const auto outputs = opreg_test::call_boxed("opreg_err::count_given", {tensors});
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].toInt(), 2);
  // Sweep 39 B-F4: an undefined element, of either list, reaches the pieces as None, as a lone
  // Tensor?'s does (an engaged optional of an undefined tensor came).
  const c10::List<at::Tensor> with_undefined({at::ones({1}), at::Tensor()});
  EXPECT_EQ(opreg_test::call_boxed("opreg_err::count_given", {with_undefined})[0].toInt(), 1);
  c10::List<std::optional<at::Tensor>> optional_with_undefined;
  optional_with_undefined.push_back(at::Tensor());
  optional_with_undefined.push_back(std::nullopt);
  optional_with_undefined.push_back(at::ones({1}));
  EXPECT_EQ(opreg_test::call_boxed("opreg_err::count_given", {optional_with_undefined})[0].toInt(),
            1);
  EXPECT_TRUE(optional_with_undefined.get(0).has_value());  // the caller's list is left as it was
  opreg::undefine("opreg_err::count_given");
}

// Sweep 42 B-F2: an undefined tensor in a Tensor[] passed opreg's checks and met PyTorch's
// internal assert in the fallback ("Found type undefined input tensor!").
TEST(Errors, AnUndefinedTensorInATensorListNamesTheArgumentAndTheIndex) {
  auto op = opreg::op("opreg_err::stacked(Tensor[] xs, Tensor[]? ys=None) -> Tensor")
                .fallback([](at::TensorList xs, const std::optional<at::TensorList>&) {
                  return at::stack(xs);
                })
                .define();
  const std::vector<at::Tensor> with_undefined{at::ones({2}), at::Tensor()};
  EXPECT_CONTAINS(error_of([&] { op(with_undefined, std::nullopt); }),
                  "opreg_err::stacked: argument 'xs' holds None (an undefined tensor) at index 1, "
                  "expected a Tensor (declare it 'Tensor?[] xs' in the schema to accept None)");
  EXPECT_CONTAINS(
      error_of([&] { op(std::vector<at::Tensor>{at::ones({2})}, at::TensorList(with_undefined)); }),
      "opreg_err::stacked: argument 'ys' holds None (an undefined tensor) at index 1");
  EXPECT_TRUE(
      at::equal(op(std::vector<at::Tensor>{at::ones({2})}, std::nullopt), at::ones({1, 2})));
}

// Sweep 38 B-F9: an enumeration value out of range met "INTERNAL ASSERT FAILED ... please report a
// bug to PyTorch".
TEST(Errors, DescribingAValueNoneOfTheEnumerationsIsRefused) {
  EXPECT_CONTAINS(error_of([] { opreg::describe(static_cast<opreg::FakeSource>(99)); }),
                  "opreg::describe: FakeSource 99 is none of the enumeration's values");
  EXPECT_CONTAINS(error_of([] { opreg::describe(static_cast<opreg::Sharding>(-1)); }),
                  "opreg::describe: Sharding -1 is none of the enumeration's values");
  // Sweep 39 B-F7: a DeviceServing's kind too ("skipped: " came).
  opreg::DeviceServing serving;
  serving.kind = static_cast<opreg::DeviceServing::Kind>(4);
  EXPECT_CONTAINS(error_of([&] { opreg::describe(serving); }),
                  "opreg::describe: DeviceServing kind 4 is none of the enumeration's values");
}

// Sweep 38 B-F4: a device type of bytes that are not UTF-8 was accepted, and every describe_ops()
// from Python then failed to decode it.
TEST(Errors, ADeviceTypeThatIsNotTextIsRefused) {
  auto message = error_of([] {
    opreg::op("opreg_err::device_bytes(Tensor x) -> Tensor")
        .fallback(identity)
        .kernel(identity, opreg::on({"\xff\xfe"}).name("k"))
        .define();
  });
  EXPECT_CONTAINS(message, "opreg_err::device_bytes: kernel 'k' names device type '\\xff\\xfe'");
  EXPECT_FALSE(opreg::is_defined("opreg_err::device_bytes"));
}

// Sweep 37 B-F2: a kernel of an op without tensor arguments never ran (the dispatcher picks a
// device's kernel by the tensors), yet kernel_status reported it serving and opcheck passed it.
TEST(Errors, AKernelOfAnOpWithoutTensorArgumentsIsRefused) {
  auto zeros = [](int64_t n) { return at::zeros({n}); };
  EXPECT_CONTAINS(error_of([&] {
                    opreg::op("opreg_err::made(int n) -> Tensor")
                        .fallback(zeros)
                        .kernel(zeros, opreg::on({"cpu"}).name("k"))
                        .define();
                  }),
                  "opreg_err::made: kernel 'k' would never run: the schema 'opreg_err::made(int n) "
                  "-> Tensor' takes no tensor argument, and PyTorch's dispatcher picks");
  EXPECT_FALSE(opreg::is_defined("opreg_err::made"));
  auto on_device = [](int64_t n, c10::Device device) { return at::zeros({n}, device); };
  EXPECT_CONTAINS(error_of([&] {
                    opreg::op("opreg_err::made(int n, Device d) -> Tensor")
                        .fallback(on_device)
                        .kernel(on_device, opreg::on({"cpu"}).name("k"))
                        .define();
                  }),
                  "opreg_err::made: kernel 'k' would never run");
  EXPECT_FALSE(opreg::is_defined("opreg_err::made"));
  opreg::op("opreg_err::made(int n) -> Tensor").fallback(zeros).define();  // fine without one
  EXPECT_TRUE(opreg::is_defined("opreg_err::made"));
  opreg::undefine("opreg_err::made");
}

// Sweep 53 B-N11: a kernel listing a device type twice was said to be two kernels of one name.
TEST(Errors, AKernelListingADeviceTypeTwiceIsSaidSo) {
  EXPECT_CONTAINS(error_of([] {
                    opreg::op("opreg_err::listed_twice(Tensor x) -> Tensor")
                        .fallback([](const at::Tensor& x) { return x; })
                        .kernel([](const at::Tensor& x) { return x; }, opreg::on({"cpu", "cpu"}))
                        .define();
                  }),
                  "serves device type 'cpu' twice (it lists it twice, or two kernels have that "
                  "name)");
  EXPECT_FALSE(opreg::is_defined("opreg_err::listed_twice"));
}
