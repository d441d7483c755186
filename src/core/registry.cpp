// src/core/registry.cpp: turns an OpSpec into dispatcher registrations, keeps them (one
// torch::Library per registration group) so that ops can be described, extended to device types
// registered later, and replaced; and holds the registry of accelerated device types.
//
// Note [How an opreg op maps onto the dispatcher]
// fallback -> CompositeExplicitAutograd: serves every backend key, Meta included, unless a more
//             specific kernel exists. Its wrapper runs the argument checks.
// kernels  -> the dense key of each device type they serve (CUDA, XPU, PrivateUse1, CPU, ...).
//             The wrapper checks arguments, asks the kernel's predicate, and calls the fallback
//             directly when the kernel declines, so a declined call costs one function call.
// fake     -> Meta: the explicit fake, or the fallback run on meta tensors with an error that
//             names the op when the fallback cannot run there.
// autograd -> Autograd (src/core/autograd.cpp); vmap -> FuncTorchBatched (src/core/vmap.cpp).
// opreg adds no dispatch of its own in front of PyTorch's dispatcher.
#include "opreg/registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "op_internal.h"
#include "opreg/device_types.h"
#include "opreg/op.h"
#include "registry_internal.h"

namespace opreg {
namespace {

struct RegisteredOp {
  detail::OpSpec spec;
  std::string ns;
  std::string op_name;  // with the overload, without the namespace
  std::string schema;
  std::string origin;
  std::vector<DeviceServing> kernels;
  // Destroying these deregisters the op. Declared last: destroyed first.
  std::vector<std::unique_ptr<torch::Library>> libraries;
};

std::atomic<uint64_t> g_generation{1};

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<RegisteredOp>> ops;
  std::vector<std::string> device_types{"cuda"};
};

Registry& registry() {
  // Leaked on purpose: ops must stay registered until the process ends, after other statics.
  static Registry* instance = new Registry();
  return *instance;
}

std::string origin_of(const void* address) {
  Dl_info info;
  if (address != nullptr && dladdr(address, &info) != 0 && info.dli_fname != nullptr) {
    return info.dli_fname;
  }
  return "unknown";
}

bool is_identifier(const std::string& text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  return std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// Splits "ns::name.overload" after validating it; `what` is the text the user passed.
void split_name(const std::string& qualified, const std::string& what, std::string* ns,
                std::string* name, std::string* overload) {
  auto colons = qualified.find("::");
  TORCH_CHECK_VALUE(colons != std::string::npos, "opreg: op name '", what,
                    "' has no namespace; expected 'namespace::name', e.g. 'mylib::", qualified,
                    "'");
  *ns = qualified.substr(0, colons);
  std::string rest = qualified.substr(colons + 2);
  auto dot = rest.find('.');
  *name = rest.substr(0, dot);
  *overload = dot == std::string::npos ? "" : rest.substr(dot + 1);
  TORCH_CHECK_VALUE(is_identifier(*ns), "opreg: op '", what, "': namespace '", *ns,
                    "' is not an identifier (letters, digits and '_', not starting with a digit)");
  TORCH_CHECK_VALUE(is_identifier(*name), "opreg: op '", what, "': name '", *name,
                    "' is not an identifier (letters, digits and '_', not starting with a digit)");
  TORCH_CHECK_VALUE(overload->empty() || is_identifier(*overload), "opreg: op '", what,
                    "': overload name '", *overload, "' is not an identifier");
}

c10::FunctionSchema parse_schema(const detail::OpSpec& spec) {
  const std::string& text = spec.name_or_schema;
  auto paren = text.find('(');
  std::string qualified = text.substr(0, paren);
  qualified.erase(qualified.find_last_not_of(" \t\n") + 1);
  std::string ns, name, overload;
  split_name(qualified, qualified, &ns, &name, &overload);
  if (paren == std::string::npos) {
    return spec.infer_schema().cloneWithName(ns + "::" + name, overload);
  }
  try {
    return torch::schema(text.c_str());
  } catch (const std::exception& error) {
    // The schema parser reports the position under the text, marked "<--- HERE".
    TORCH_CHECK_VALUE(false, "opreg: op '", qualified, "': cannot parse schema '", text,
                      "': ", error.what());
  }
}

// Registers `kernel` for `device_type`, or records why it was skipped.
void register_kernel(RegisteredOp& op, const detail::KernelSpec& kernel,
                     const std::string& device_type, bool explicit_device) {
  std::string why_not;
  auto key = dispatch_key_for_device_type(device_type, &why_not);
  if (!key) {
    TORCH_CHECK_VALUE(!explicit_device || device_type != "meta", op.spec.runtime->name,
                      ": kernel '", kernel.name,
                      "' lists device type 'meta'; meta tensors are served by the fake "
                      "(.fake(fn)), not by a kernel");
    op.kernels.push_back({device_type, "skipped: " + why_not});
    return;
  }
  for (const auto& serving : op.kernels) {
    if (serving.device_type != device_type || serving.served_by.rfind("kernel:", 0) != 0) continue;
    TORCH_CHECK_VALUE(!explicit_device, op.spec.runtime->name, ": kernels '",
                      serving.served_by.substr(7), "' and '", kernel.name,
                      "' both serve device type '", device_type,
                      "'; give each device type one kernel and decline inside it");
    op.kernels.push_back({device_type, "skipped: kernel '" + serving.served_by.substr(7) +
                                           "' already serves this device type"});
    return;
  }
  auto library =
      std::make_unique<torch::Library>(torch::Library::FRAGMENT, op.ns, std::nullopt, "opreg", 0);
  try {
    if (kernel.make_boxed) {
      const auto& schema = detail::find_operator(op.spec.runtime->name).schema();
      library->impl(op.op_name.c_str(), torch::dispatch(*key, kernel.make_boxed(op.spec, schema)));
    } else {
      library->impl(op.op_name.c_str(), torch::dispatch(*key, kernel.make_impl()));
    }
  } catch (const c10::Error& error) {
    TORCH_CHECK_VALUE(false, op.spec.runtime->name, ": cannot register kernel '", kernel.name,
                      "' for device type '", device_type, "': ", error.what_without_backtrace());
  }
  op.libraries.push_back(std::move(library));
  op.kernels.push_back({device_type, "kernel:" + kernel.name});
}

void register_kernels(RegisteredOp& op, const std::vector<std::string>& registry_types) {
  for (const auto& kernel : op.spec.kernels) {
    const auto& types = kernel.device_types ? *kernel.device_types : registry_types;
    for (const auto& raw : types) {
      register_kernel(op, kernel, normalize_device_type(raw), kernel.device_types.has_value());
    }
  }
}

OpReport report_of(const RegisteredOp& op) {
  OpReport report;
  report.name = op.spec.runtime->name;
  report.schema = op.schema;
  report.origin = op.origin;
  report.kernels = op.kernels;
  report.fake = op.spec.explicit_fake ? "explicit" : "fallback on meta";
  report.bitwise = op.spec.bitwise;
  report.random = op.spec.vmap.random;
  for (const auto& [index, dtypes] : op.spec.runtime->dtype_rules) {
    std::vector<std::string> names;
    for (auto dtype : dtypes) names.emplace_back(c10::toString(dtype));
    report.dtypes.emplace_back(op.spec.runtime->arg_names[index], names);
  }
  report.autograd = detail::describe_autograd(op.spec);
  report.vmap = detail::describe_vmap(op.spec);
  return report;
}

}  // namespace

std::string normalize_device_type(const std::string& name) {
  auto begin = name.find_first_not_of(" \t\n");
  auto end = name.find_last_not_of(" \t\n");
  std::string normalized = begin == std::string::npos ? "" : name.substr(begin, end - begin + 1);
  std::transform(normalized.begin(), normalized.end(), normalized.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return normalized;
}

std::optional<c10::DispatchKey> dispatch_key_for_device_type(const std::string& name,
                                                             std::string* why_not) {
  if (name == "meta") {
    *why_not = "meta tensors are served by the op's fake, not by kernels";
    return std::nullopt;
  }
  if (name.empty() || name.find(':') != std::string::npos) {
    *why_not = "'" + name + "' is not a device type name (expected e.g. 'cuda', without an index)";
    return std::nullopt;
  }
  try {
    c10::Device device(name);
    return c10::computeDispatchKey(std::nullopt, std::nullopt, device);
  } catch (const c10::Error&) {
    *why_not = "this PyTorch build does not know the device type '" + name + "'";
    return std::nullopt;
  }
}

std::vector<std::string> accelerated_device_types() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return registry().device_types;
}

std::string register_accelerated_device_type(const std::string& name) {
  std::string normalized = normalize_device_type(name);
  TORCH_CHECK_VALUE(!normalized.empty(),
                    "opreg: register_accelerated_device_type: the device type name is empty");
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (std::find(reg.device_types.begin(), reg.device_types.end(), normalized) !=
      reg.device_types.end()) {
    return normalized;
  }
  reg.device_types.push_back(normalized);
  for (auto& [name_, op] : reg.ops) {
    for (const auto& kernel : op->spec.kernels) {
      if (!kernel.device_types) register_kernel(*op, kernel, normalized, false);
    }
  }
  return normalized;
}

namespace detail {

uint64_t registry_generation() { return g_generation.load(std::memory_order_acquire); }

c10::OperatorHandle find_operator(const std::string& qualified) {
  auto dot = qualified.find('.', qualified.find("::"));
  auto handle = c10::Dispatcher::singleton().findSchema(
      {qualified.substr(0, dot), dot == std::string::npos ? "" : qualified.substr(dot + 1)});
  TORCH_CHECK_VALUE(handle.has_value(), "opreg: no op named '", qualified, "' is defined");
  return *handle;
}

void throw_no_fake(const std::string& op, const std::string& reason) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op,
                              ": has no fake, and its fallback failed on meta tensors; give the op "
                              "a fake (.fake(fn) in C++, fake_fn= in Python). The fallback said: ",
                              reason);
}

std::string define(OpSpec spec, size_t spec_size) {
  TORCH_CHECK(spec_size == sizeof(OpSpec),
              "opreg: an op library was built against different opreg headers than the loaded "
              "libopreg (OpSpec of ",
              spec_size, " bytes, expected ", sizeof(OpSpec), "); rebuild it against this opreg");
  // 1. Name and schema.
  c10::FunctionSchema schema = parse_schema(spec);
  std::string qualified =
      schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  auto op = std::make_unique<RegisteredOp>();
  std::string unused_name, unused_overload;
  split_name(qualified, qualified, &op->ns, &unused_name, &unused_overload);
  op->op_name = qualified.substr(op->ns.size() + 2);
  std::ostringstream schema_text;
  schema_text << schema;
  op->schema = schema_text.str();
  op->origin = spec.origin.empty() ? origin_of(spec.caller) : spec.origin;

  // 2. Argument names for messages, and dtype rules by index.
  auto& runtime = *spec.runtime;
  runtime.name = qualified;
  for (const auto& argument : schema.arguments()) runtime.arg_names.push_back(argument.name());
  for (const auto& [argument, allowed] : spec.dtype_rules) {
    auto found = std::find(runtime.arg_names.begin(), runtime.arg_names.end(), argument);
    TORCH_CHECK_VALUE(found != runtime.arg_names.end(), qualified, ": dtypes() names argument '",
                      argument, "', which the schema '", op->schema, "' does not have");
    runtime.dtype_rules.emplace_back(found - runtime.arg_names.begin(), allowed);
  }

  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);

  // 3. An existing op of that name: replace it only when asked, and only if opreg owns it.
  auto existing = reg.ops.find(qualified);
  if (existing != reg.ops.end()) {
    TORCH_CHECK_VALUE(spec.replace, qualified, ": an op of this name is already defined (by ",
                      existing->second->origin,
                      "); pass replace=True (.replace() in C++) to replace it");
    reg.ops.erase(existing);
    g_generation.fetch_add(1);
  }
  auto known = c10::Dispatcher::singleton().findSchema({schema.name(), schema.overload_name()});
  TORCH_CHECK_VALUE(!known.has_value(), qualified,
                    ": an op of this name is already defined outside opreg (",
                    known ? known->debug() : "", "); opreg cannot replace it");

  // 4. Registrations. If any step fails, `op` is destroyed and PyTorch forgets the rest.
  spec.is_mutable = schema.is_mutable();
  op->spec = std::move(spec);
  auto library =
      std::make_unique<torch::Library>(torch::Library::FRAGMENT, op->ns, std::nullopt, "opreg", 0);
  if (!op->spec.python_module.empty()) {
    library->set_python_module(op->spec.python_module.c_str());
  }
  try {
    library->def(std::move(schema));
  } catch (const c10::Error& error) {
    TORCH_CHECK_VALUE(false, qualified, ": cannot define the op: ", error.what_without_backtrace());
  }
  auto register_at = [&](c10::DispatchKey key, torch::CppFunction function, const char* what) {
    try {
      library->impl(op->op_name.c_str(), torch::dispatch(key, std::move(function)));
    } catch (const c10::Error& error) {
      TORCH_CHECK_VALUE(false, qualified, ": cannot register the ", what, ": ",
                        error.what_without_backtrace());
    }
  };
  register_at(c10::DispatchKey::CompositeExplicitAutograd, op->spec.make_fallback(), "fallback");
  if (op->spec.register_meta) {
    register_at(c10::DispatchKey::Meta, op->spec.make_meta(), "fake");
  }
  register_autograd(*library, op->op_name, op->spec);
  register_vmap(*library, op->op_name, op->spec);
  op->libraries.push_back(std::move(library));
  register_kernels(*op, reg.device_types);

  reg.ops.emplace(qualified, std::move(op));
  return qualified;
}

}  // namespace detail

std::vector<OpReport> describe_ops() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<OpReport> reports;
  for (const auto& [name, op] : reg.ops) reports.push_back(report_of(*op));
  return reports;
}

OpReport describe_op(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto found = reg.ops.find(name);
  TORCH_CHECK_VALUE(found != reg.ops.end(), "opreg: no op named '", name, "' was defined by opreg");
  return report_of(*found->second);
}

namespace detail {

std::shared_ptr<c10::KernelFunction> fallback_kernel_of(const std::string& op) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto found = reg.ops.find(op);
  TORCH_CHECK_VALUE(found != reg.ops.end(), "opreg: no op named '", op, "' was defined by opreg");
  return found->second->spec.fallback_kernel;
}

}  // namespace detail

bool is_defined(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return reg.ops.count(name) != 0;
}

void undefine(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto found = reg.ops.find(name);
  TORCH_CHECK_VALUE(found != reg.ops.end(), "opreg: cannot undefine '", name,
                    "': no op of this name was defined by opreg");
  reg.ops.erase(found);
  g_generation.fetch_add(1);
}

}  // namespace opreg
