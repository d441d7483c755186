// tests/op_library/failing_ops.cpp: op libraries whose static initializers define one good op and
// then make one mistake (chosen by OPREG_FAILURE at compile time; some undefine an op first), for
// the tests that loading them raises one clear error, rolls the good op back (and the undefined
// op in), and keeps the process alive; two (thread_define, thread_replace) that define or
// replace an op from a thread their initializer waits for, which must load; and one
// (wait_then_fail) that waits, while other threads act, before it fails.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#if defined(OPREG_OTHER_VERSION)  // as if built against the headers of another minor version
#include <opreg/version.h>
#undef OPREG_VERSION_MINOR
#define OPREG_VERSION_MINOR 99
#endif
#include <opreg/opreg.h>
#include <opreg/triton.h>

namespace {

at::Tensor identity(const at::Tensor& x) { return x.clone(); }

const auto good = opreg::op("opreg_failing::good_" OPREG_FAILURE "(Tensor x) -> Tensor")
                      .fallback(identity)
                      .define();

#if defined(OPREG_BAD_SCHEMA)
const auto bad =
    opreg::op("opreg_failing::bad(Tensor x, Tensr y) -> Tensor").fallback(identity).define();
#elif defined(OPREG_DUPLICATE_NAME)
const auto first =
    opreg::op("opreg_failing::twice(Tensor x) -> Tensor").fallback(identity).define();
const auto second =
    opreg::op("opreg_failing::twice(Tensor x) -> Tensor").fallback(identity).define();
#elif defined(OPREG_NESTED_LOAD)         // loads the library OPREG_NESTED_LIBRARY names as it loads
const bool nested = [] {
  const char* path = std::getenv("OPREG_NESTED_LIBRARY");
  opreg::load_library(path != nullptr ? path : "OPREG_NESTED_LIBRARY is not set");
  if (std::getenv("OPREG_NESTED_THEN_FAIL") != nullptr) {  // then fails itself
    opreg::op("opreg_failing::bad(Tensor x, Tensr y) -> Tensor").fallback(identity).define();
  }
  return true;
}();
#elif defined(OPREG_UNDEFINE_THEN_FAIL)  // undefines an op defined before the load, then fails
const bool undefined = (opreg::undefine("opreg::fused_add"), true);
const auto bad =
    opreg::op("opreg_failing::bad(Tensor x, Tensr y) -> Tensor").fallback(identity).define();
#elif defined(OPREG_UNDEFINE_NAMED)      // undefines the op OPREG_UNDEFINE_NAME names, and loads
const bool undefined = [] {
  const char* name = std::getenv("OPREG_UNDEFINE_NAME");
  opreg::undefine(name != nullptr ? name : "OPREG_UNDEFINE_NAME is not set");
  return true;
}();
#elif defined(OPREG_UNDEFINE_UNKNOWN)    // undefines an op that no one defined
const bool undefined = (opreg::undefine("opreg_failing::never_defined"), true);
#elif defined(OPREG_THREAD_DEFINE)       // defines an op on a thread that it waits for, and loads
const bool from_thread = [] {
  std::thread([] {
    opreg::op("opreg_failing::from_thread(Tensor x) -> Tensor").fallback(identity).define();
  }).join();
  return true;
}();
#elif defined(OPREG_THREAD_REPLACE)  // replaces OPREG_REPLACE_NAME's op from a thread it waits for
const bool from_thread = [] {
  const char* name = std::getenv("OPREG_REPLACE_NAME");
  std::thread([name] {
    opreg::op(std::string(name != nullptr ? name : "OPREG_REPLACE_NAME_is_not::set") +
              "(Tensor x) -> Tensor")
        .fallback(identity)
        .replace()
        .define();
  }).join();
  return true;
}();
#elif defined(OPREG_DEFINE_ALL)      // two ops defined together, the second with a bad schema
const auto together = [] {
  std::vector<opreg::OpBuilder> builders;
  for (const char* schema : {"opreg_failing::together_a(Tensor x) -> Tensor",
                             "opreg_failing::together_b(Tensor x, Tensr y) -> Tensor"}) {
    opreg::OpBuilder builder(schema);
    builder.fallback(
        opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(identity)));
    builders.push_back(std::move(builder));
  }
  return opreg::define_all(std::move(builders));
}();
#elif defined(OPREG_FACTORY_THROWS)  // a kernel factory that throws what is no std::exception
const auto thrown = [] {
  opreg::OpBuilder builder("opreg_failing::factory_throws(Tensor x) -> Tensor");
  builder.fallback(
      opreg::KernelFactory{[](const opreg::KernelContext&) -> c10::KernelFunction { throw 42; }});
  return std::move(builder).define();
}();
#elif defined(OPREG_DEVICE_TYPE_THEN_FAIL)  // registers an accelerated device type, then fails
const auto registered = opreg::register_accelerated_device_type("hpu");
const auto bad =
    opreg::op("opreg_failing::bad(Tensor x, Tensr y) -> Tensor").fallback(identity).define();
#elif defined(OPREG_WAIT_THEN_FAIL)  // replaces OPREG_REPLACE_NAME's op, defines another, waits
                                     // for the file OPREG_WAIT_FILE names (other threads act
                                     // meanwhile), then fails
const bool waited = [] {
  const char* name = std::getenv("OPREG_REPLACE_NAME");
  opreg::op(std::string(name != nullptr ? name : "OPREG_REPLACE_NAME_is_not::set") +
            "(Tensor x) -> Tensor")
      .fallback(identity)
      .replace()
      .define();
  opreg::op("opreg_failing::waited(Tensor x) -> Tensor").fallback(identity).define();
  const char* file = std::getenv("OPREG_WAIT_FILE");
  for (int i = 0; i < 2000 && file != nullptr && !std::ifstream(file).good(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}();
const auto bad =
    opreg::op("opreg_failing::bad(Tensor x, Tensr y) -> Tensor").fallback(identity).define();
#elif defined(OPREG_EMPTY_FALLBACK)  // a typed fallback that is an empty function
at::Tensor (*no_fallback)(const at::Tensor&) = nullptr;
const auto empty =
    opreg::op("opreg_failing::empty_fallback(Tensor x) -> Tensor").fallback(no_fallback).define();
#elif defined(OPREG_UNKNOWN_FLAG)    // a flag by a name that is no flag's
const auto unknown = [] {
  opreg::OpBuilder builder("opreg_failing::unknown_flag(Tensor x) -> Tensor");
  builder.fallback(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(identity)));
  builder.flag("nosuchflag", true);
  return std::move(builder).define();
}();
#elif defined(OPREG_NULL_FLAG)       // a builder's refusal (22nd sweep, B-F3: python_fake(""))
const auto null_flag = [] {
  opreg::OpBuilder builder("opreg_failing::null_flag(Tensor x) -> Tensor");
  builder.fallback(
      opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(identity)));
  builder.flag(static_cast<bool opreg::OpFlags::*>(nullptr), true);
  return std::move(builder).define();
}();
#elif defined(OPREG_DEFINED_TWICE)   // one declaration defined twice (22nd sweep, B-F3)
auto twice = opreg::op("opreg_failing::defined_twice").fallback(identity);
const auto first = std::move(twice).define();
const auto second = std::move(twice).define();
#elif defined(OPREG_FIND_UNKNOWN)  // opreg's lookups of an op that is not there (23rd sweep, B-F2)
const auto handle = opreg::find_operator("opreg_failing::not_defined_anywhere");
#elif defined(OPREG_DESCRIBE_UNKNOWN)
const auto report = opreg::describe_op("opreg_failing::not_described");
#elif defined(OPREG_HANDLE_UNKNOWN)  // opreg's other API in an initializer (24th sweep, B-F1)
const at::Tensor called =
    opreg::OpHandle<at::Tensor(const at::Tensor&)>("opreg_failing::no_handle")(at::ones({2}));
#elif defined(OPREG_HANDLE_DEVICE)   // a Device has no empty value to give back (30th sweep, B-F4)
const c10::Device device =
    opreg::OpHandle<c10::Device(const at::Tensor&)>("opreg_failing::no_device")(at::ones({2}));
const auto pair = opreg::OpHandle<std::tuple<at::Tensor, c10::Device>(const at::Tensor&)>(
    "opreg_failing::no_pair")(at::ones({2}));
#elif defined(OPREG_HANDLE_MISMATCH)
const at::Tensor called = opreg::OpHandle<at::Tensor(const at::Tensor&, int64_t)>(
    "opreg_failing::good_handle_mismatch")(at::ones({2}), 3);
#elif defined(OPREG_CHECK_UNKNOWN)
const auto results = opreg::testing::check("opreg_failing::not_checked", {{at::ones({2})}});
const auto outputs = opreg::testing::call_fallback("opreg_failing::not_called", {at::ones({2})});
#elif defined(OPREG_BUNDLE_MISSING)
const auto kernels = opreg::triton::load_bundle_dir("/nonexistent/opreg_failing_bundle");
#elif defined(OPREG_SIGNATURE_MISMATCH)
const auto mismatch =
    opreg::op("opreg_failing::mismatch(Tensor x, Tensor y) -> Tensor").fallback(identity).define();
#endif

}  // namespace
