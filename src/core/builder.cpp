// src/core/builder.cpp: OpBuilder, the one path from a declaration to an op (see
// include/opreg/definition.h), and the words of an op's report (include/opreg/registry.h).
#include <sstream>

#include <c10/util/Exception.h>

#include "opreg/definition.h"
#include "opreg/registry.h"
#include "spec.h"

namespace opreg {

const std::vector<std::pair<std::string, std::string>>& op_flag_names() {
  static const auto& names = *new std::vector<std::pair<std::string, std::string>>{
#define OPREG_FLAG_NAME(flag, promise) {#flag, promise},
      OPREG_OP_FLAGS(OPREG_FLAG_NAME)
#undef OPREG_FLAG_NAME
  };
  return names;
}

OpBuilder::OpBuilder(std::string name_or_schema) : state_(std::make_unique<State>()) {
  state_->name_or_schema = std::move(name_or_schema);
}
OpBuilder::~OpBuilder() = default;
OpBuilder::OpBuilder(OpBuilder&&) noexcept = default;
OpBuilder& OpBuilder::operator=(OpBuilder&&) noexcept = default;

// A builder's methods never throw: they run in libraries' static initializers, where an
// exception ends the process. A mistake is kept (the first), and define() raises it, which a
// library's load records.
namespace {
OpBuilder::State& live(std::unique_ptr<OpBuilder::State>& state) {
  if (state == nullptr) {  // defined, or moved from: a builder of nothing, which define() refuses
    state = std::make_unique<OpBuilder::State>();
    state->mistake = "opreg: this OpBuilder was already defined (or moved from); make a new one";
  }
  return *state;
}

void keep_first(OpBuilder::State& state, std::string mistake) {
  if (state.mistake.empty()) state.mistake = std::move(mistake);
}
}  // namespace

std::string OpBuilder::declared_name() const {
  if (state_ == nullptr) return "";
  const auto& text = state_->name_or_schema;
  return text.substr(0, text.find('('));
}

OpBuilder& OpBuilder::infer_schema(std::function<c10::FunctionSchema()> infer) {
  live(state_).infer_schema = std::move(infer);
  return *this;
}

OpBuilder& OpBuilder::fallback(KernelFactory factory) {
  live(state_).fallback = std::move(factory);
  return *this;
}

OpBuilder& OpBuilder::fake(KernelFactory factory) {
  live(state_).fake = std::move(factory);
  return *this;
}

// The module whose fakes python_fake() names: the Python front's, which registers them itself.
constexpr const char* kPythonFrontModule = "opreg._declaration";

OpBuilder& OpBuilder::python_fake(std::string python_module, KernelFactory meta) {
  if (python_module.empty()) {
    keep_first(live(state_), c10::str("opreg: op '", declared_name(),
                                      "': python_fake() needs the name of the module that "
                                      "registers the fake; it got an empty name"));
  } else if (python_module != kPythonFrontModule) {
    // Python's register_fake refuses a piece for an op C++ defines (the definition holds all of
    // them), so no other module could register it: the op would silently have none.
    keep_first(live(state_),
               c10::str("opreg: op '", declared_name(), "': python_fake('", python_module,
                        "') is the Python front's (module ", kPythonFrontModule,
                        "); an op defined in C++ gives its fake with fake(), or "
                        "runs its fallback on meta tensors without one"));
  }
  live(state_).python_module = std::move(python_module);
  live(state_).python_meta = std::move(meta);
  return *this;
}

OpBuilder& OpBuilder::fallback_words(std::string words) {
  live(state_).fallback_words = std::move(words);
  return *this;
}

OpBuilder& OpBuilder::declared_in_python() {
  live(state_).declared_in_python = true;
  return *this;
}

OpBuilder& OpBuilder::kernel(KernelFactory factory, std::string name,
                             std::optional<std::vector<std::string>> devices) {
  live(state_).kernels.push_back({std::move(name), std::move(devices), std::move(factory)});
  return *this;
}

OpBuilder& OpBuilder::dtypes(std::string argument, std::vector<c10::ScalarType> allowed) {
  live(state_).dtype_rules.emplace_back(std::move(argument), std::move(allowed));
  return *this;
}

OpBuilder& OpBuilder::flag(bool OpFlags::* flag, bool on) {
  if (flag == nullptr) {
    keep_first(live(state_), c10::str("opreg: op '", declared_name(),
                                      "': flag() got a null member pointer; name a member of "
                                      "opreg::OpFlags"));
    return *this;
  }
  live(state_).flags.*flag = on;
  return *this;
}

OpBuilder& OpBuilder::flag(const std::string& name, bool on) {
#define OPREG_FLAG_BY_NAME(flag_name, promise) \
  if (name == #flag_name) return flag(&OpFlags::flag_name, on);
  OPREG_OP_FLAGS(OPREG_FLAG_BY_NAME)
#undef OPREG_FLAG_BY_NAME
  std::ostringstream known;
  for (const auto& [flag_name, promise] : op_flag_names()) known << " " << flag_name;
  keep_first(live(state_), c10::str("opreg: op '", declared_name(), "': no flag named '", name,
                                    "'; the flags are:", known.str()));
  return *this;
}

OpBuilder& OpBuilder::backward(Backward backward, SetupContext setup_context) {
  auto& autograd = live(state_).autograd;
  autograd.backward = std::move(backward);
  autograd.setup_context = std::move(setup_context);
  return *this;
}

OpBuilder& OpBuilder::autograd(AutogradPolicy policy) {
  live(state_).autograd.policy = policy;
  return *this;
}

OpBuilder& OpBuilder::sharding(Sharding sharding) {
  live(state_).sharding = sharding;
  return *this;
}

OpBuilder& OpBuilder::vmap(VmapRule rule) {
  live(state_).vmap_rule = std::move(rule);
  return *this;
}

OpBuilder& OpBuilder::replace(bool replace) {
  live(state_).replace = replace;
  return *this;
}

OpBuilder& OpBuilder::replace_only(uint64_t serial) {
  live(state_).replace = true;
  live(state_).replace_only = serial;
  return *this;
}

OpBuilder& OpBuilder::origin(std::string where) {
  live(state_).origin = std::move(where);
  return *this;
}

OpBuilder& OpBuilder::part_of(std::string owner) {
  live(state_).part_of = std::move(owner);
  return *this;
}

OpBuilder& OpBuilder::caller(const void* address) {
  live(state_).caller = address;
  return *this;
}

// ---- reports, in words ----------------------------------------------------------------------

std::string describe(const DeviceServing& serving) {
  switch (serving.kind) {
    case DeviceServing::Kind::kKernel:
      return "kernel:" + serving.kernel;
    case DeviceServing::Kind::kSkipped:
      return "skipped: " + serving.reason;
  }
  TORCH_CHECK_VALUE(false, "opreg::describe: DeviceServing kind ", static_cast<int>(serving.kind),
                    " is none of the enumeration's values");
}

std::string describe(FakeSource fake) {
  switch (fake) {
    case FakeSource::kExplicit:
      return "explicit";
    case FakeSource::kPython:
      return "explicit (registered from Python)";
    case FakeSource::kFallbackOnMeta:
      return "fallback on meta";
  }
  // A value cast from an int the enumeration does not have: the caller's mistake.
  TORCH_CHECK_VALUE(false, "opreg::describe: FakeSource ", static_cast<int>(fake),
                    " is none of the enumeration's values");
}

std::string describe(AutogradSupport autograd) {
  switch (autograd) {
    case AutogradSupport::kBackward:
      return "backward";
    case AutogradSupport::kFallback:
      return "fallback (no backward: the fallback runs under autograd when grads are needed)";
    case AutogradSupport::kError:
      return "error (no backward: calls needing grads are refused)";
    case AutogradSupport::kNone:
      return "none (outputs never require grad)";
  }
  // A value cast from an int the enumeration does not have: the caller's mistake.
  TORCH_CHECK_VALUE(false, "opreg::describe: AutogradSupport ", static_cast<int>(autograd),
                    " is none of the enumeration's values");
}

std::string describe(VmapSupport vmap) {
  switch (vmap) {
    case VmapSupport::kRule:
      return "rule";
    case VmapSupport::kBatchPolymorphic:
      return "batch-polymorphic (one call for the whole batch)";
    case VmapSupport::kPerExampleLoop:
      return "per-example loop (asked for by the op)";
    case VmapSupport::kFallback:
      return "fallback (PyTorch batches the fallback's ATen ops)";
  }
  // A value cast from an int the enumeration does not have: the caller's mistake.
  TORCH_CHECK_VALUE(false, "opreg::describe: VmapSupport ", static_cast<int>(vmap),
                    " is none of the enumeration's values");
}

std::string describe(Sharding sharding) {
  switch (sharding) {
    case Sharding::kNone:
      return "none (DTensor refuses calls on DTensors)";
    case Sharding::kReplicate:
      return "replicate (DTensor gathers the inputs; every rank computes the whole output)";
    case Sharding::kPointwise:
      return "pointwise (each rank computes its shard of the output)";
    case Sharding::kPython:
      return "a strategy function (registered from Python)";
  }
  // A value cast from an int the enumeration does not have: the caller's mistake.
  TORCH_CHECK_VALUE(false, "opreg::describe: Sharding ", static_cast<int>(sharding),
                    " is none of the enumeration's values");
}

std::string describe(const OpReport& report) {
  std::ostringstream text;
  text << report.name << "\n  schema:   " << report.schema << "\n  origin:   " << report.origin;
  for (const auto& serving : report.kernels) {
    std::string device = serving.device_type + ":";
    device.resize(std::max<size_t>(device.size(), 9), ' ');
    text << "\n  " << device << " " << describe(serving);
  }
  text << "\n  others:   fallback"
       << "\n  fake:     " << describe(report.fake) << "\n  autograd: " << describe(report.autograd)
       << "\n  vmap:     " << describe(report.vmap)
       << "\n  dtensor:  " << describe(report.sharding);
  std::string flags;
#define OPREG_FLAG_WORD(flag, promise) \
  if (report.flags.flag) flags += std::string(flags.empty() ? "" : ", ") + #flag;
  OPREG_OP_FLAGS(OPREG_FLAG_WORD)
#undef OPREG_FLAG_WORD
  if (!flags.empty()) text << "\n  flags:    " << flags;
  for (const auto& [argument, dtypes] : report.dtypes) {
    text << "\n  dtypes:   " << argument << ":";
    for (const auto& dtype : dtypes) text << " " << dtype;
  }
  return text.str();
}

}  // namespace opreg
