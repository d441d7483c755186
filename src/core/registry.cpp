// src/core/registry.cpp: turns an OpBuilder's declaration into an immutable definition and
// publishes it on the dispatcher; keeps each op's dispatcher entry for the life of the process so
// that handles, replaces and undefines stay safe; holds the registry of accelerated device types.
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
//
// Note [Definitions are immutable]
// What the dispatcher calls for an opreg op is a trampoline per dispatch key: a boxed kernel that
// loads the op's current Definition (an atomic pointer, kept alive by a count of calls in flight)
// for the whole call. define() validates and builds a new Definition completely, then publishes it
// with one atomic store: a call runs either the old definition or the new one, never a mix, and a
// failed define() or replace changes nothing. Registrations with the dispatcher outlive
// definitions: the schema stays registered while it is unchanged, and trampolines are only added or
// removed when the set of dispatch keys changes; the functor of every trampoline ever registered is
// kept alive (OpEntry::functors), so removing one while another thread runs it frees nothing. An
// op's dispatcher entry is never removed (undefine() empties the slot: calls then raise an error
// naming the op), so OperatorHandles and Python OpOverloads taken earlier stay valid.
#include "opreg/registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/DispatchKeyExtractor.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <ATen/functorch/BatchedTensorImpl.h>
#include <ATen/functorch/DynamicLayer.h>
#include <ATen/functorch/PlumbingHelper.h>
#include <ATen/functorch/TensorWrapper.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/impl/COW.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/ScopeExit.h>
#include <torch/library.h>

#include "load_internal.h"
#include "op_internal.h"
#include "opreg/detail/schema_types.h"
#include "opreg/detail/text.h"
#include "opreg/device_types.h"
#include "opreg/op.h"
#include "spec.h"

namespace opreg {
namespace {

struct ServedKernel {
  c10::DispatchKey key;
  std::string kernel;
  c10::KernelFunction function;
  std::string label;  // "kernel '<name>'", for messages
};

// One immutable definition of an op. Trampolines read it at the start of a call.
struct Definition {
  explicit Definition(OpBuilder::State declared) : spec(std::move(declared)) {}
  Definition(const Definition&) = delete;
  Definition& operator=(const Definition&) = delete;

  OpBuilder::State spec;  // keeps the pieces' captures alive; rebuilt for new device types
  // Names the definition as declared (kept when it is rebuilt for a new device type): what
  // Python's pieces of a definition check that they still belong to the op's current one.
  uint64_t serial = 0;
  // A part's (spec.part_of): the serial of its owner's definition that it came with (0: none);
  // while the owner has that definition, the part is undefined only with it.
  uint64_t owner_serial = 0;
  // The accelerated device types it was built for: kernels without device types of their own
  // serve these.
  std::vector<std::string> device_types;
  detail::IdentityPtr identity;
  std::string origin;
  std::vector<size_t> required_tensors;  // arguments that must be defined tensors
  // Tensor[] and Tensor[]? arguments: a C++ caller's list may hold an undefined tensor, which the
  // pieces met as PyTorch's internal assert (sweep 42 B-F2).
  std::vector<size_t> tensor_lists;
  // Arguments other than Tensor: a boxed call's hand-made stack may hold another kind there, which
  // the pieces' unboxing would meet with an internal assert, or an enum beyond its values.
  std::vector<std::pair<size_t, const c10::Type*>> checked_values;
  // Lists of a declared length (int[2]): PyTorch's unboxing passes any length on.
  std::vector<std::pair<size_t, size_t>> fixed_lengths;
  std::vector<size_t> optional_tensors;  // Tensor? arguments: an undefined tensor there is None
  // Tensor?[] arguments: a boxed C++ call may give a List<Tensor>, which the pieces' unboxing
  // refuses ("Tried to cast a List<Tensor> to a List<Tensor?>").
  std::vector<size_t> lists_of_optional_tensors;
  // Tensor[]? arguments: PyTorch's dispatcher computes a call's keys from every other kind of
  // tensor argument, but not from these (see Note [Tensors only in a Tensor[]?]).
  std::vector<size_t> optional_tensor_lists;
  std::vector<std::pair<size_t, std::vector<c10::ScalarType>>> dtype_rules;  // by argument index
  std::vector<size_t> plain_tensor_returns;
  std::vector<size_t> other_tensor_returns;  // Tensor? and Tensor[]
  // Outputs other than Tensor: a boxed piece may push any kind there, which Python would read as
  // it is and a typed caller would meet with an internal assert.
  std::vector<std::pair<size_t, const c10::Type*>> checked_returns;
  std::vector<bool> return_aliases;  // per return: declared as aliasing an input
  // Per return declared as an alias: the arguments it may alias (empty: any, a wildcard).
  std::vector<std::vector<size_t>> return_alias_arguments;
  // ScalarType, Layout and MemoryFormat outputs: integers on the stack, with their count of values.
  std::vector<std::pair<size_t, int64_t>> enum_returns;
  std::vector<size_t> string_returns;  // outputs holding a str: Python reads them as UTF-8
  std::vector<std::pair<size_t, size_t>> fixed_length_returns;  // int[2] outputs, as arguments
  // The first output that holds a Device (Device, Device?, Device[]): the fallback run on meta
  // tensors would give 'meta' there, so it serves as no fake.
  std::optional<size_t> device_return;
  c10::KernelFunction fallback;
  // The fallback behind the checks of a call, for kernels that decline and for the autograd and
  // vmap kernels, which call it directly rather than through the dispatcher.
  detail::FallbackPtr checked_fallback;
  std::optional<c10::KernelFunction> meta;  // nullopt: the fake is registered from Python
  FakeSource fake_source = FakeSource::kFallbackOnMeta;
  std::vector<ServedKernel> kernels;
  std::vector<DeviceServing> serving;  // for reports, skipped device types included
  // What each piece's KernelContext::label refers to: a piece may keep the context's references,
  // which must live as long as it does (sweep 41 B-F2: a kernel's label was a temporary).
  std::deque<std::string> piece_labels;
  c10::KernelFunction autograd;
  c10::KernelFunction vmap;
  std::optional<c10::KernelFunction> randomness;
  Sharding sharding = Sharding::kNone;  // resolved: as declared, or the default
  // The op entry's schema_generation when this definition was published (again).
  mutable std::atomic<uint64_t> schema_generation{0};

  const ServedKernel* kernel_at(c10::DispatchKey key) const {
    for (const auto& served : kernels) {
      if (served.key == key) return &served;
    }
    return nullptr;
  }
  const std::string& name() const { return identity->name; }
  const c10::FunctionSchema& schema() const { return identity->schema; }
  const std::string& schema_text() const { return identity->schema_text; }
};

using DefinitionPtr = std::shared_ptr<const Definition>;

// An op's place in the registry and on the dispatcher; never destroyed (see the Note).
struct OpEntry {
  std::string qualified, ns, op_name;
  // What calls read: the current definition, owned by `owner`. A definition replaced while
  // calls may read it is kept in `retired` until a publish finds no call in flight.
  std::atomic<const Definition*> current{nullptr};
  mutable std::atomic<int64_t> calls_in_flight{0};
  // See Note [A call racing a change of schema].
  std::atomic<bool> schema_changed{false};
  std::atomic<uint64_t> schema_generation{0};
  DefinitionPtr owner;  // read and written under the registry lock
  std::vector<DefinitionPtr> retired;
  // Definitions published (a define, replace, undefine or rollback; not a rebuild for a device
  // type), and the count before and after the latest publish: under the registry lock. A failed
  // load's rollback puts back only what still follows its own publication.
  uint64_t changes = 0;
  detail::ChangeCount last_change;
  // The registered schema, with what else its registration carries.
  struct Registered {
    std::string text;  // the schema as text: what tells two schemas apart
    c10::FunctionSchema schema;
    std::string python_module;  // the module that registers its fake (empty: none)
    std::vector<at::Tag> tags;
  };
  std::optional<Registered> registered;
  std::unique_ptr<torch::Library> schema_library;
  std::map<c10::DispatchKey, std::unique_ptr<torch::Library>> trampolines;
  std::vector<c10::BoxedKernel> functors;

  DefinitionPtr load() const { return owner; }
  // Returns what no call can read any more, to be destroyed after the registry lock is released.
  std::vector<DefinitionPtr> store(DefinitionPtr definition) {
    if (owner) retired.push_back(std::move(owner));
    owner = std::move(definition);
    current.store(owner.get());
    std::vector<DefinitionPtr> unreachable;
    if (calls_in_flight.load() == 0) unreachable.swap(retired);
    return unreachable;
  }
};

// The definition an autograd call of an op runs with, for the call below autograd that it makes
// on the same thread: its forward must come from the definition whose backward it records, even
// if a replace publishes another one in between. A thread-local variable of a shared library costs
// a call to the dynamic loader (__tls_get_addr) each time it is named, so each call of an op
// names it once.
struct PinnedDefinition {
  const OpEntry* entry = nullptr;
  const Definition* definition = nullptr;
};
thread_local PinnedDefinition pinned_definition;

class PinDefinition {
 public:
  PinDefinition(const OpEntry& entry, const Definition* definition)
      : slot_(pinned_definition), previous_(slot_) {
    slot_ = {&entry, definition};
  }
  ~PinDefinition() { slot_ = previous_; }
  PinDefinition(const PinDefinition&) = delete;
  PinDefinition& operator=(const PinDefinition&) = delete;

 private:
  PinnedDefinition& slot_;
  PinnedDefinition previous_;
};

// Held by a trampoline for the whole call: the definition it read stays alive until it returns.
// The call below autograd of an autograd call takes the definition pinned for it, and only that
// call: one its pieces make anew (a fallback calling its op after replacing or undefining it)
// reads the current definition (sweep 45 B-N10: it ran the pinned one on the new schema's stack).
// A call at the Autograd key is always made anew.
class CallInFlight {
 public:
  CallInFlight(const OpEntry& entry, bool below_autograd) : entry_(entry) {
    entry_.calls_in_flight.fetch_add(1);  // before reading the definition: see store()
    PinnedDefinition& pinned = pinned_definition;
    if (below_autograd && pinned.entry == &entry_) {
      definition_ = pinned.definition;
      pin_ = &pinned;
      pinned = {};
    } else {
      definition_ = entry_.current.load();
    }
  }
  ~CallInFlight() {
    if (pin_ != nullptr) *pin_ = {&entry_, definition_};
    entry_.calls_in_flight.fetch_sub(1);
  }
  CallInFlight(const CallInFlight&) = delete;
  CallInFlight& operator=(const CallInFlight&) = delete;
  const Definition* definition() const { return definition_; }
  // The call below autograd of an autograd call: its stack was made for the pinned definition.
  bool pinned() const { return pin_ != nullptr; }

 private:
  const OpEntry& entry_;
  PinnedDefinition* pin_ = nullptr;  // the pin this call took, given back when it returns
  const Definition* definition_;
};

struct Registry {
  std::recursive_mutex mutex;  // recursive: a fallback may define ops while a define runs it
  std::map<std::string, OpEntry*> ops;
  std::vector<std::string> device_types{"cuda"};
  // How many times each registered type was asked for (cuda, built in, is not counted): a failed
  // load takes back its own requests, and a type goes when none is left.
  std::map<std::string, int64_t> device_type_requests;
};

// Whether this thread is inside a definition (define_all, or the rebuild for a new device type),
// which holds the registry's lock: see Note [A schema change and Python's callers].
thread_local bool defining = false;

// The definitions a change left unreachable, dropped when it goes out of scope, after the locks
// are released, with detail::dropping_definitions() true meanwhile.
thread_local int t_dropping_definitions = 0;
struct Garbage {
  std::vector<DefinitionPtr> definitions;
  Garbage() = default;
  Garbage(const Garbage&) = delete;
  Garbage& operator=(const Garbage&) = delete;
  ~Garbage() {
    ++t_dropping_definitions;
    definitions.clear();
    --t_dropping_definitions;
  }
};

Registry& registry() {
  // Leaked on purpose: ops must stay registered until the process ends, after other statics.
  static Registry* instance = new Registry();
  return *instance;
}

// The file mapped at `address`, from /proc/self/maps: what dladdr says, without the dynamic
// loader's lock (see detail::library_loading_elsewhere).
std::string mapped_file_of(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t begin = 0, end = 0;
    const char* text = line.c_str();
    char* rest = nullptr;
    begin = std::strtoull(text, &rest, 16);
    if (rest == nullptr || *rest != '-') continue;
    end = std::strtoull(rest + 1, &rest, 16);
    if (target < begin || target >= end) continue;
    const auto path = line.find('/');
    return path == std::string::npos ? "unknown" : line.substr(path);
  }
  return "unknown";
}

// Under the registry's lock (`defining`), dladdr could wait for the dynamic loader's lock held by
// a thread whose library's initializer waits for the registry's lock (a plain dlopen, which
// opreg does not see): a deadlock. define_all asks before it takes the lock.
std::string origin_of(const void* address) {
  if (address == nullptr) {  // a raw OpBuilder: the library being loaded, if any
    const std::string loading = detail::loading_library_path();
    return loading.empty() ? "unknown" : loading;
  }
  if (defining || detail::library_loading_elsewhere()) return mapped_file_of(address);
  Dl_info info;
  if (dladdr(address, &info) != 0 && info.dli_fname != nullptr) return info.dli_fname;
  return "unknown";
}

// A library that defined ops stays loaded: its code is what the definitions call. Not under the
// registry's lock (see origin_of): define_all pins once it has released it, the outermost
// definition for those nested in it, which owns the list. A pointer: the first use of a
// thread-local with a destructor takes the dynamic loader's lock (see Guarantees).
thread_local std::vector<const void*>* t_libraries_to_pin = nullptr;
void pin_library_of(const void* address) {
  if (address == nullptr) return;
  detail::when_loader_is_free([address] {
    Dl_info info;
    if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return;
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  });
}

bool is_identifier(const std::string& text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  return std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// PyTorch writes an op without an overload as 'ns::x.default', a name no op can have ("default is
// not a legal overload name"): said where such a name is looked for (sweep 51 B-N24: a part_of
// spelled so was accepted, and its part outlived the op).
std::string default_overload_hint(const std::string& name) {
  const std::string suffix = ".default";
  if (name.size() <= suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return "";
  }
  return " ('" + detail::escaped(name) + "' is PyTorch's spelling of the op '" +
         detail::escaped(name.substr(0, name.size() - suffix.size())) +
         "', which opreg names without '.default')";
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
  // Immortal, as every static here: threads may define ops while exit handlers run (sweep 53
  // B-N48: destroyed at std::exit, a segfault in a defining thread).
  static const auto& kReserved = *new std::set<std::string>{"aten", "prim", "prims", "torch", "_"};
  TORCH_CHECK_VALUE(kReserved.count(*ns) == 0, "opreg: op '", what, "': the namespace '", *ns,
                    "' belongs to PyTorch; define ops in a namespace of your own");
}

// The schema infer_schema reads (from the fallback's C++ signature, unless the builder was given
// another function); whatever it throws names the op (sweep 53 B-N7: a c10 error named none, and
// what is not a std::exception reached the caller as it was).
c10::FunctionSchema inferred_schema(const OpBuilder::State& spec, const std::string& qualified) {
  static const auto& kThrew = *new std::string(
      "': its infer_schema (its schema read from a C++ "
      "signature) threw");
  try {
    return spec.infer_schema();
  } catch (c10::Error& error) {
    if (!detail::names_op(error, qualified)) error.add_context("in infer_schema of " + qualified);
    throw;
  } catch (const std::exception& error) {
    TORCH_CHECK_VALUE(false, "opreg: op '", qualified, kThrew, ": ", detail::what_of(error));
#if defined(__GLIBCXX__)
  } catch (const abi::__forced_unwind&) {
    throw;  // a cancelled thread's unwinding must go on
#endif
  } catch (...) {
    TORCH_CHECK_VALUE(false, "opreg: op '", qualified, kThrew,
                      " something that is not a std::exception");
  }
}

// The number of elements of a list value; none for other values.
std::optional<size_t> list_length(const c10::IValue& value) {
  if (value.isIntList()) return value.toIntList().size();
  if (value.isDoubleList()) return value.toDoubleList().size();
  if (value.isBoolList()) return value.toBoolList().size();
  if (value.isTensorList()) return value.toTensorList().size();
  if (value.isList()) return value.toListRef().size();
  return std::nullopt;
}

// PyTorch's schema parser reads an int default such as 0x10 as 0, silently: refuse prefixed
// literals (0x, 0o, 0b) where a default value starts.
void check_decimal_defaults(const std::string& qualified, const std::string& text) {
  for (size_t i = 0; i + 2 < text.size(); ++i) {
    if (text[i] != '0' || std::string("xXoObB").find(text[i + 1]) == std::string::npos ||
        !std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      continue;
    }
    size_t before = text.find_last_not_of(" \t\n", i == 0 ? 0 : i - 1);
    if (before != std::string::npos && text[before] == '-' && before > 0) {
      before = text.find_last_not_of(" \t\n", before - 1);
    }
    if (i == 0 || before == std::string::npos ||
        std::string("=[,").find(text[before]) == std::string::npos) {
      continue;
    }
    size_t end = i + 2;
    while (end < text.size() && std::isalnum(static_cast<unsigned char>(text[end]))) ++end;
    TORCH_CHECK_VALUE(false, "opreg: op '", qualified, "': cannot parse schema '", text,
                      "': the default '", text.substr(i, end - i),
                      "' is not a decimal number (PyTorch's schema parser would read it as 0)");
  }
}

bool holds_tensors(const c10::Type& type);
std::optional<int64_t> enum_values(const c10::Type& type);
std::string enum_name(const c10::Type& type);
bool checkable(const c10::Type& type);

c10::FunctionSchema parse_schema(const OpBuilder::State& spec) {
  const std::string& text = spec.name_or_schema;
  for (size_t i = 0; i < text.size(); ++i) {
    TORCH_CHECK_VALUE(static_cast<unsigned char>(text[i]) < 0x80, "opreg: op declaration '",
                      text.substr(0, text.find('(')), "': the schema has a non-ASCII character at ",
                      "position ", i, "; schemas are ASCII");
    TORCH_CHECK_VALUE(text[i] != '\0', "opreg: op declaration '",
                      text.substr(0, std::min(text.find('('), i)),
                      "': the schema has a NUL character at position ", i,
                      "; the text after it would be ignored");
  }
  auto paren = text.find('(');
  std::string qualified = text.substr(0, paren);
  qualified.erase(qualified.find_last_not_of(" \t\n") + 1);
  std::string ns, name, overload;
  split_name(qualified, qualified, &ns, &name, &overload);
  if (paren == std::string::npos) {
    // In the words of the front that declared it (sweep 48 B-M3: a C++ user read of a Python
    // function).
    TORCH_CHECK_VALUE(static_cast<bool>(spec.infer_schema), "opreg: op '", qualified,
                      "': no schema given (expected '", qualified, "(Tensor x, ...) -> Tensor'), ",
                      spec.declared_in_python
                          ? "and none can be inferred from a Python function"
                          : "and a boxed or factory-made C++ piece has no signature to infer one "
                            "from; give the schema, or use opreg::op with a typed fallback");
    return inferred_schema(spec, qualified).cloneWithName(ns + "::" + name, overload);
  }
  check_decimal_defaults(qualified, text);
  c10::FunctionSchema schema = [&] {
    try {
      return torch::schema(text.c_str());
    } catch (const c10::Error& error) {
      // A list default of the wrong type trips an internal assert of the parser's ("... please
      // report a bug to PyTorch. expected double"): say what it means.
      const std::string& message = error.msg();
      const size_t expected = message.rfind("expected ");
      if (message.find("INTERNAL ASSERT") != std::string::npos && expected != std::string::npos) {
        TORCH_CHECK_VALUE(false, "opreg: op '", qualified, "': cannot parse schema '", text,
                          "': a list default holds a value that is not a ",
                          message.substr(expected + 9, message.find_first_of(" \n", expected + 9) -
                                                           (expected + 9)));
      }
      // Other internal asserts of the parser's say what is wrong after PyTorch's bug-report
      // request ("... please report a bug to PyTorch. Non-default positional argument follows
      // default argument. Parameter b in ..."): keep what they say, not the assert.
      constexpr const char* kReport = "please report a bug to PyTorch. ";
      const size_t report = message.find(kReport);
      if (message.find("INTERNAL ASSERT") != std::string::npos && report != std::string::npos) {
        TORCH_CHECK_VALUE(false, "opreg: op '", qualified, "': cannot parse schema '", text,
                          "': ", message.substr(report + std::strlen(kReport)));
      }
      TORCH_CHECK_VALUE(false, "opreg: op '", qualified, "': cannot parse schema '", text,
                        "': ", error.what_without_backtrace());
    } catch (const std::out_of_range&) {  // std::stoll of an int default, std::stod of a float
      TORCH_CHECK_VALUE(false, "opreg: op '", qualified, "': cannot parse schema '", text,
                        "': a number in it is out of range (an int default must fit in 64 bits; "
                        "a float default must be 0 or of a double's size, 2.2e-308 to 1.8e308)");
    } catch (const std::exception& error) {
      // The schema parser reports the position under the text, marked "<--- HERE".
      TORCH_CHECK_VALUE(false, "opreg: op '", qualified, "': cannot parse schema '", text,
                        "': ", detail::what_of(error));
    }
  }();
  std::set<std::string> seen;
  for (const auto& argument : schema.arguments()) {
    TORCH_CHECK_VALUE(seen.insert(argument.name()).second, "opreg: op '", qualified,
                      "': the schema names argument '", argument.name(),
                      "' twice; give each argument its own name");
    const auto& default_value = argument.default_value();
    if (default_value && !default_value->type()->isSubtypeOf(*argument.type())) {
      std::ostringstream shown;
      shown << *default_value;
      TORCH_CHECK_VALUE(false, "opreg: op '", qualified, "': argument '", argument.name(),
                        "' has the default ", shown.str(), " (a ", default_value->type()->str(),
                        "), expected a ", argument.real_type()->str(), " (schema '", text, "')");
    }
    // PyTorch's parser takes a list default of any length for an int[N].
    const auto length = list_length(default_value ? *default_value : c10::IValue());
    TORCH_CHECK_VALUE(!argument.N() || !length || *length == static_cast<size_t>(*argument.N()),
                      "opreg: op '", qualified, "': argument '", argument.name(),
                      "' has a default of ", length.value_or(0), " elements, expected ",
                      argument.N().value_or(0), " (schema '", text, "')");
    // PyTorch's parser takes any int for a ScalarType, Layout or MemoryFormat default.
    const auto values = enum_values(*argument.real_type());
    if (values && default_value && default_value->isInt()) {
      TORCH_CHECK_VALUE(default_value->toInt() >= 0 && default_value->toInt() < *values,
                        "opreg: op '", qualified, "': argument '", argument.name(),
                        "' has the default ", default_value->toInt(), ", which is no ",
                        enum_name(*argument.real_type()), " (expected 0 to ", *values - 1,
                        "; schema '", text, "')");
    }
  }
  // An alias annotation says which tensors share memory: on an int it means nothing, and
  // torch.compile's functionalization would misread it.
  auto check_alias = [&](const c10::Argument& argument, const std::string& what) {
    TORCH_CHECK_VALUE(argument.alias_info() == nullptr || holds_tensors(*argument.type()),
                      "opreg: op '", qualified, "': ", what, " (", argument.type()->str(),
                      ") has an alias annotation; only Tensor, Tensor?, Tensor[] and Tensor?[] "
                      "can alias (schema '",
                      text, "')");
  };
  for (const auto& argument : schema.arguments()) {
    check_alias(argument, "argument '" + argument.name() + "'");
  }
  for (size_t i = 0; i < schema.returns().size(); ++i) {
    check_alias(schema.returns()[i], "output " + std::to_string(i));
  }
  if (spec.infer_schema) {
    auto inferred = inferred_schema(spec, qualified);
    if (auto difference = detail::signature_difference(inferred, schema)) {
      std::ostringstream inferred_text;
      inferred_text << inferred;
      TORCH_CHECK_VALUE(false, "opreg: op '", qualified,
                        "': the fallback's C++ signature does not match the schema: ", *difference,
                        " (the fallback's signature reads as '", inferred_text.str(),
                        "', the schema is '", text, "')");
    }
  }
  return schema;
}

std::string qualified_name_of(const c10::FunctionSchema& schema) {
  return schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
}

// ---- building a definition -------------------------------------------------------------------

// Tensor, Tensor?, Tensor[] and Tensor?[]: the arguments whose tensors dtypes() can check.
bool holds_tensors(const c10::Type& type) {
  const c10::Type* element = &type;
  if (const auto* optional = element->castRaw<c10::OptionalType>()) {  // Tensor[]?
    element = optional->getElementType().get();
  }
  if (const auto* list = element->castRaw<c10::ListType>()) element = list->getElementType().get();
  if (const auto* optional = element->castRaw<c10::OptionalType>()) {
    element = optional->getElementType().get();
  }
  return element->kind() == c10::TypeKind::TensorType;
}

std::vector<std::pair<size_t, std::vector<c10::ScalarType>>> resolve_dtype_rules(
    const OpBuilder::State& spec, const detail::OpIdentity& op) {
  const auto& arguments = op.schema.arguments();
  std::vector<std::pair<size_t, std::vector<c10::ScalarType>>> rules;
  for (const auto& [argument, allowed] : spec.dtype_rules) {
    auto found = std::find_if(arguments.begin(), arguments.end(),
                              [&](const auto& candidate) { return candidate.name() == argument; });
    TORCH_CHECK_VALUE(found != arguments.end(), op.name, ": dtypes() names argument '",
                      detail::escaped(argument), "', which the schema '", op.schema_text,
                      "' does not have");
    TORCH_CHECK_VALUE(holds_tensors(*found->type()), op.name, ": dtypes() names argument '",
                      argument,
                      "', which is not a Tensor, Tensor?, Tensor[] or Tensor?[] in the schema '",
                      op.schema_text, "'");
    TORCH_CHECK_VALUE(!allowed.empty(), op.name, ": dtypes() for argument '", argument,
                      "' allows no dtype; list at least one");
    for (auto dtype : allowed) {
      const auto value = static_cast<int>(dtype);
      TORCH_CHECK_VALUE(value >= 0 && value < static_cast<int>(c10::ScalarType::NumOptions) &&
                            dtype != c10::ScalarType::Undefined,
                        op.name, ": dtypes() for argument '", argument, "' lists ScalarType ",
                        value, ", which is no dtype");
    }
    TORCH_CHECK_VALUE(std::none_of(rules.begin(), rules.end(),
                                   [&](const auto& rule) {
                                     return rule.first ==
                                            static_cast<size_t>(found - arguments.begin());
                                   }),
                      op.name, ": dtypes() is given twice for argument '", argument,
                      "'; list every allowed dtype in one call");
    rules.emplace_back(found - arguments.begin(), allowed);
  }
  return rules;
}

// Why the schema does not fit Sharding::kPointwise (empty when it does): DTensor's pointwise
// strategy shards Tensor (and Tensor?) arguments and Tensor outputs, and opreg's Python side
// checks at the call that the output has the inputs' broadcast shape.
// The first argument the op writes or an output views, said (empty: none): a sharding that
// redistributes it hands the op a new tensor, and the write or the view would reach only that.
std::string aliased_argument(const c10::FunctionSchema& schema) {
  for (const auto& argument : schema.arguments()) {
    if (argument.alias_info() != nullptr) {
      return "argument '" + argument.name() + "' is mutated or aliased (" + argument.type()->str() +
             ")";
    }
  }
  return "";
}

std::string why_not_pointwise(const c10::FunctionSchema& schema) {
  if (auto aliased = aliased_argument(schema); !aliased.empty()) return aliased;
  bool any_tensor = false;
  for (const auto& argument : schema.arguments()) {
    const auto& type = argument.type();
    const bool tensor = type->kind() == c10::TypeKind::TensorType ||
                        type->isSubtypeOf(*c10::OptionalType::ofTensor());
    if (!tensor && (type->isSubtypeOf(*c10::ListType::ofTensors()) ||
                    type->isSubtypeOf(*c10::ListType::ofOptionalTensors()))) {
      return "argument '" + argument.name() + "' is a " + type->str();
    }
    any_tensor = any_tensor || tensor;
  }
  if (!any_tensor) return "it has no Tensor argument";
  if (schema.returns().empty()) return "it returns nothing";
  for (size_t i = 0; i < schema.returns().size(); ++i) {
    const auto& ret = schema.returns()[i];
    if (ret.type()->kind() != c10::TypeKind::TensorType || ret.alias_info() != nullptr) {
      return "output " + std::to_string(i) + " is a " + detail::written_type(ret) +
             (ret.alias_info() != nullptr ? " aliasing an input" : "");
    }
  }
  return "";
}

// The declared sharding, or none. Pointwise is never a default, not even for batch-polymorphic
// ops: batch_polymorphic promises extra leading dims, not elementwise work (a row softmax is
// batch-polymorphic), and a pointwise strategy on such an op would shard the dims it reduces
// over and return wrong numbers without an error.
Sharding resolve_sharding(const OpBuilder::State& spec, const detail::OpIdentity& op) {
  const std::string why_not = why_not_pointwise(op.schema);
  // Said in the words of the front that declared it (sweep 47 A-U1: Sharding::kReplicate to a
  // Python user).
  const bool python = spec.declared_in_python;
  const char* replicate_or_none =
      python ? "sharding=\"replicate\" or \"none\", or a strategy function"
             : "Sharding::kReplicate, kNone, or a strategy function (Python)";
  const char* none = python ? "sharding=\"none\"" : "Sharding::kNone";
  if (spec.sharding) {
    const auto value = static_cast<int>(*spec.sharding);
    TORCH_CHECK_VALUE(
        value >= static_cast<int>(Sharding::kNone) && value <= static_cast<int>(Sharding::kPython),
        op.name, ": sharding ", value, " is no opreg::Sharding");
    TORCH_CHECK_VALUE(*spec.sharding != Sharding::kPointwise || why_not.empty(), op.name,
                      ": sharding pointwise needs Tensor or scalar arguments and Tensor outputs, "
                      "none of them mutated, but ",
                      why_not, " in the schema '", op.schema_text, "'; declare ",
                      replicate_or_none);
    const std::string aliased = aliased_argument(op.schema);
    TORCH_CHECK_VALUE(*spec.sharding != Sharding::kReplicate || aliased.empty(), op.name,
                      ": sharding replicate gathers each DTensor argument into a new tensor, but ",
                      aliased, " in the schema '", op.schema_text,
                      "': the op's write (or an output's view) would reach that copy, not the "
                      "argument; declare ",
                      none, ", or a strategy function", python ? "" : " (Python)",
                      " that keeps that argument's placement");
    return *spec.sharding;
  }
  return Sharding::kNone;
}

c10::KernelFunction make_piece(Definition& definition, const KernelFactory& factory,
                               std::string piece_label, detail::FallbackPtr fallback) {
  const std::string& label = definition.piece_labels.emplace_back(std::move(piece_label));
  TORCH_CHECK_VALUE(static_cast<bool>(factory.make), definition.name(), ": the factory of its ",
                    label, " is empty (KernelFactory::make holds no function)");
  const KernelContext context{definition.name(), definition.schema(), label, std::move(fallback)};
  c10::KernelFunction piece;
  try {
    piece = detail::run_user_code<c10::KernelFunction>(
        definition.name(), "the factory of its ", label, [&] { return factory.make(context); });
  } catch (c10::Error& error) {  // sweep 44 B-F3: a TORCH_CHECK of the factory named no one
    if (!detail::names_op(error, definition.name())) {
      error.add_context("in the factory of the " + label + " of " + definition.name());
    }
    throw;
  }
  TORCH_CHECK_VALUE(piece.isValid(), definition.name(), ": the factory of its ", label,
                    " made an empty c10::KernelFunction, which nothing could call");
  return piece;
}

void add_kernel(Definition& definition, const KernelDeclaration& kernel,
                const std::string& device_type, bool explicit_device) {
  const std::string& op = definition.name();
  TORCH_CHECK_VALUE(!kernel.name.empty(), op,
                    ": a kernel has an empty name, which reports and traces would show as "
                    "'kernel:'; name it (opreg::on({...}).name(\"triton\")) or keep the default");
  // Reports, traces and Python read the name as text: bytes that are not UTF-8 (or control
  // bytes) made describe_op raise UnicodeDecodeError.
  TORCH_CHECK_VALUE(detail::escaped(kernel.name) == kernel.name, op, ": kernel name '",
                    detail::escaped(kernel.name),
                    "' holds bytes that are not UTF-8 text (or control bytes), which reports and "
                    "Python cannot show; name it with text");
  std::string why_not;
  auto key = dispatch_key_for_device_type(device_type, &why_not);
  if (!key) {
    TORCH_CHECK_VALUE(!explicit_device || device_type != "meta", op, ": kernel '", kernel.name,
                      "' lists device type 'meta'; meta tensors are served by the fake "
                      "(.fake(fn) in C++, fake_fn= in Python), not by a kernel");
    // As the Python fronts refuse them: a device ('cuda:0') or nothing is no device type.
    TORCH_CHECK_VALUE(
        !explicit_device || (!device_type.empty() && device_type.find(':') == std::string::npos),
        op, ": kernel '", kernel.name, "' lists '", device_type,
        "', which is not a device type (expected a name like 'cuda', without an "
        "index: a kernel serves every device of its type)");
    definition.serving.push_back(
        {device_type, DeviceServing::Kind::kSkipped, kernel.name, why_not});
    return;
  }
  if (const auto* served = definition.kernel_at(*key)) {
    // One name: a kernel listing the device type twice, as often as two kernels named alike
    // (sweep 53 B-N11: "kernels 'kernel' and 'kernel'").
    TORCH_CHECK_VALUE(!explicit_device || served->kernel != kernel.name, op, ": kernel '",
                      kernel.name, "' serves device type '", device_type,
                      "' twice (it lists it twice, or two kernels have that name); list each "
                      "device type once, and name kernels apart");
    TORCH_CHECK_VALUE(!explicit_device, op, ": kernels '", served->kernel, "' and '", kernel.name,
                      "' both serve device type '", device_type,
                      "'; give each device type one kernel and decline inside it");
    definition.serving.push_back(
        {device_type, DeviceServing::Kind::kSkipped, kernel.name,
         "kernel '" + served->kernel + "' already serves this device type"});
    return;
  }
  definition.kernels.push_back(
      {*key, kernel.name,
       make_piece(definition, kernel.factory, "kernel:" + kernel.name, definition.checked_fallback),
       "kernel '" + kernel.name + "'"});
  definition.serving.push_back({device_type, DeviceServing::Kind::kKernel, kernel.name, ""});
}

void check_arguments(const Definition& definition, const torch::jit::Stack& stack);
void normalize_arguments(const Definition& definition, torch::jit::Stack& stack);
void run_checked_fallback(const Definition& d, const c10::OperatorHandle& op,
                          c10::DispatchKeySet keys, torch::jit::Stack* stack);

// The boxed fallback with the checks of a call around it (Definition::checked_fallback). A
// kernel factory may keep KernelContext::fallback past its definition (sweep 40 B-F2: a replace
// freed the definition under it): a call then holds the definition while it runs, or, once the
// definition is gone, is refused naming the op. Weak: the definition owns this kernel.
class CheckedFallback final : public c10::OperatorKernel {
 public:
  CheckedFallback(const std::shared_ptr<const Definition>& definition, std::string op)
      : definition_(definition), op_(std::move(op)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const auto definition = definition_.lock();
    TORCH_CHECK(definition != nullptr, op_,
                ": the fallback of a definition that was replaced or undefined was called (a "
                "KernelContext::fallback kept past its definition); call the fallback that the "
                "current definition's kernel factory is given");
    // A kernel's stack as a dispatched call's: too few values read before it (sweep 43 B-F1).
    // A wrong one is the kernel's, not its caller's (sweep 46 B-F3: it read as the caller's).
    try {
      check_arguments(*definition, *stack);
      normalize_arguments(*definition, *stack);
    } catch (c10::Error& error) {
      error.add_context(c10::str("in the values a kernel of ", op_,
                                 " gave KernelContext::fallback, which it must give the op's "
                                 "arguments as a call does"));
      throw;
    }
    run_checked_fallback(*definition, op, keys, stack);
  }

 private:
  std::weak_ptr<const Definition> definition_;
  std::string op_;
};

// Everything validated and built; nothing published.
// The alias sets an argument or return names, its elements' included (`Tensor(a)[]`); nullopt
// for a wildcard.
std::optional<std::set<c10::Symbol>> alias_sets_of(const c10::AliasInfo* info) {
  std::set<c10::Symbol> sets;
  if (info == nullptr) return sets;
  if (info->isWildcardBefore()) return std::nullopt;
  sets.insert(info->beforeSets().begin(), info->beforeSets().end());
  for (const auto& contained : info->containedTypes()) {
    auto inner = alias_sets_of(&contained);
    if (!inner) return std::nullopt;
    sets.insert(inner->begin(), inner->end());
  }
  return sets;
}

// How many values an enumeration type (or an optional one) has; nullopt for other types.
std::optional<int64_t> enum_values(const c10::Type& type) {
  if (const auto* optional = type.castRaw<c10::OptionalType>()) {
    return enum_values(*optional->getElementType());
  }
  switch (type.kind()) {
    case c10::TypeKind::ScalarTypeType:
      return static_cast<int64_t>(c10::ScalarType::NumOptions);
    case c10::TypeKind::LayoutType:
      return static_cast<int64_t>(c10::Layout::NumOptions);
    case c10::TypeKind::MemoryFormatType:
      return static_cast<int64_t>(c10::MemoryFormat::NumOptions);
    default:
      return std::nullopt;
  }
}

std::string enum_name(const c10::Type& type) {
  const auto* optional = type.castRaw<c10::OptionalType>();
  return optional ? optional->getElementType()->str() : type.str();
}

// The types opreg checks and passes on every path (eager, autograd, vmap, fakes); others
// (Future, Await, RRef, Union, Storage, Stream, ...) would reach the pieces unchecked, and some
// crash the process when given None.
bool supported(const c10::Type& type) {
  if (const auto* optional = type.castRaw<c10::OptionalType>()) {
    return supported(*optional->getElementType());
  }
  if (const auto* list = type.castRaw<c10::ListType>()) {
    const auto& element = *list->getElementType();
    return element.kind() != c10::TypeKind::ListType && supported(element);
  }
  switch (type.kind()) {
    case c10::TypeKind::TensorType:
    case c10::TypeKind::ComplexType:
    case c10::TypeKind::GeneratorType:
      return true;
    default:
      return checkable(type);  // the values a call's arguments are checked as
  }
}

// Why opreg refuses a schema type, or null. PyTorch's tracers and functorch meet an `Any`
// value or a dict with errors of their own that name no op (an internal assert under vmap), and
// an `Any` reaches the pieces unchecked; the tensors of a tuple or a dict would escape the
// checks of a call's outputs (an output returned as an input's alias).
const char* refused_type(const c10::Type& type) {
  if (detail::holds_kind(type, c10::TypeKind::AnyType)) return "Any";
  if (detail::holds_kind(type, c10::TypeKind::DictType)) return "Dict";
  if (detail::holds_kind(type, c10::TypeKind::TupleType)) return "tuple";
  // The tensors of a list inside a list (Tensor[][]) reach neither autograd's nor functorch's
  // handling of list arguments, nor the checks of the outputs.
  const c10::Type* outer = &type;
  if (const auto* optional = type.castRaw<c10::OptionalType>()) {
    outer = optional->getElementType().get();
  }
  const auto* list = outer->castRaw<c10::ListType>();
  if (list != nullptr && detail::holds_kind(*list->getElementType(), c10::TypeKind::ListType) &&
      detail::holds_kind(type, c10::TypeKind::TensorType)) {
    return "list of tensor lists";
  }
  return supported(type) ? nullptr : "such";
}

// The names of the definitions this thread is building (a kernel factory runs inside a build).
// One defined again by a factory would be published, then overwritten by the build around it,
// whose serial is older (sweep 48 B-F3: the op's serial went back). A pointer, as
// t_libraries_to_pin: the outermost build owns the list.
thread_local std::vector<std::string>* t_names_in_build = nullptr;
class NamesInBuild {
 public:
  NamesInBuild() : owner_(t_names_in_build == nullptr) {
    if (owner_) t_names_in_build = &names_;
    mark_ = t_names_in_build->size();
  }
  ~NamesInBuild() {
    t_names_in_build->resize(mark_);
    if (owner_) t_names_in_build = nullptr;
  }
  NamesInBuild(const NamesInBuild&) = delete;
  NamesInBuild& operator=(const NamesInBuild&) = delete;

 private:
  std::vector<std::string> names_;
  bool owner_;
  size_t mark_ = 0;
};

// `rebuilt_from` null: a new declaration, which gets a serial of its own.
std::shared_ptr<Definition> build(OpBuilder::State spec,
                                  const std::vector<std::string>& device_types,
                                  const Definition* rebuilt_from = nullptr) {
  static std::atomic<uint64_t> last_serial{0};
  auto definition = std::make_shared<Definition>(std::move(spec));
  definition->serial = rebuilt_from != nullptr ? rebuilt_from->serial : ++last_serial;
  if (rebuilt_from != nullptr) definition->owner_serial = rebuilt_from->owner_serial;
  definition->device_types = device_types;
  const auto& declared = definition->spec;
  TORCH_CHECK_VALUE(declared.mistake.empty(), declared.mistake);
  c10::FunctionSchema schema = parse_schema(declared);
  std::ostringstream schema_text;
  schema_text << schema;
  const std::string qualified = qualified_name_of(schema);
  if (t_names_in_build != nullptr) {
    const auto& building = *t_names_in_build;
    TORCH_CHECK_VALUE(std::find(building.begin(), building.end(), qualified) == building.end(),
                      qualified, ": defined while a definition of ", qualified,
                      " is being built (by one of the kernel factories that build runs), which "
                      "would overwrite it once built; nothing was defined: define it outside "
                      "the factories");
    t_names_in_build->push_back(qualified);
  }
  definition->identity = std::make_shared<const detail::OpIdentity>(
      detail::OpIdentity{qualified, std::move(schema), schema_text.str(), definition->serial});
  const auto& op = *definition->identity;
  // A path need not be UTF-8; the origin goes into messages and to Python as a str.
  definition->origin =
      detail::valid_utf8(declared.origin.empty() ? origin_of(declared.caller) : declared.origin);
  if (declared.part_of) {
    const auto& owner = *declared.part_of;
    const auto colons = owner.find("::");
    const auto dot = owner.find('.');
    const bool well_formed = colons != std::string::npos &&
                             is_identifier(owner.substr(0, colons)) &&
                             is_identifier(owner.substr(
                                 colons + 2, dot == std::string::npos ? dot : dot - colons - 2)) &&
                             (dot == std::string::npos || dot > colons);
    TORCH_CHECK_VALUE(well_formed, qualified, ": part_of('", detail::escaped(owner),
                      "') names no op (expected 'namespace::name')");
    const std::string hint = default_overload_hint(owner);
    TORCH_CHECK_VALUE(hint.empty(), qualified, ": part_of('", detail::escaped(owner),
                      "') names no op", hint);
    TORCH_CHECK_VALUE(owner != qualified, qualified, ": an op cannot be part of itself");
  }
  TORCH_CHECK_VALUE(static_cast<bool>(declared.fallback.make), qualified,
                    ": the declaration has no fallback");
  TORCH_CHECK_VALUE(!declared.fake || declared.python_module.empty(), qualified,
                    ": fake() and python_fake('", declared.python_module,
                    "') are both declared, but they are two sources of one fake; declare one");
  definition->dtype_rules = resolve_dtype_rules(declared, op);
  definition->sharding = resolve_sharding(declared, op);

  for (const auto& [where, list] :
       {std::pair{"argument", &op.schema.arguments()}, std::pair{"output", &op.schema.returns()}}) {
    for (size_t i = 0; i < list->size(); ++i) {
      const auto& value = (*list)[i];
      const char* refused = refused_type(*value.real_type());
      TORCH_CHECK_VALUE(refused == nullptr, qualified, ": ", where, " '",
                        value.name().empty() ? std::to_string(i) : value.name(), "' has type ",
                        value.real_type()->str(), ", and opreg ops take no ", refused,
                        " type: declare its type (Tensor, int, float, bool, str, Scalar, a list or "
                        "optional of them), and several outputs as separate outputs");
    }
  }
  for (size_t i = 0; i < op.schema.arguments().size(); ++i) {
    const auto& argument = op.schema.arguments()[i];
    if (argument.type()->kind() == c10::TypeKind::TensorType) {
      definition->required_tensors.push_back(i);
    } else if (argument.type()->isSubtypeOf(*c10::OptionalType::ofTensor())) {
      definition->optional_tensors.push_back(i);
    } else if (checkable(*argument.real_type())) {
      definition->checked_values.emplace_back(i, argument.real_type().get());
    }
    if (argument.type()->isSubtypeOf(*c10::OptionalType::create(c10::ListType::ofTensors()))) {
      definition->tensor_lists.push_back(i);
      definition->optional_tensor_lists.push_back(i);
    }
    if (argument.N()) definition->fixed_lengths.emplace_back(i, *argument.N());
    if (argument.type()->isSubtypeOf(*c10::ListType::ofOptionalTensors()) &&
        !argument.type()->isSubtypeOf(*c10::ListType::ofTensors())) {
      definition->lists_of_optional_tensors.push_back(i);
    }
  }
  for (size_t i = 0; i < op.schema.returns().size(); ++i) {
    const auto& ret = op.schema.returns()[i];
    if (auto values = enum_values(*ret.real_type()))
      definition->enum_returns.emplace_back(i, *values);
    if (detail::holds_kind(*ret.type(), c10::TypeKind::StringType))
      definition->string_returns.push_back(i);
    if (ret.N()) definition->fixed_length_returns.emplace_back(i, *ret.N());
    if (!definition->device_return && detail::holds_kind(*ret.type(), c10::TypeKind::DeviceObjType))
      definition->device_return = i;
    if (ret.type()->kind() != c10::TypeKind::TensorType)
      definition->checked_returns.emplace_back(i, ret.real_type().get());
    if (ret.type()->kind() == c10::TypeKind::TensorType) {
      definition->plain_tensor_returns.push_back(i);
    } else if (ret.type()->isSubtypeOf(*c10::OptionalType::ofTensor()) ||
               ret.type()->isSubtypeOf(*c10::ListType::ofTensors()) ||
               ret.type()->isSubtypeOf(*c10::ListType::ofOptionalTensors())) {
      definition->other_tensor_returns.push_back(i);
      // The autograd kernel attaches gradients to Tensor outputs only: an explicit backward
      // would silently give a list output no gradient.
      TORCH_CHECK_VALUE(
          !declared.autograd.backward || ret.type()->kind() != c10::TypeKind::ListType, qualified,
          ": output ", i, " is a ", ret.type()->str(),
          ", and an explicit backward covers Tensor outputs only; return the "
          "tensors as separate outputs, or leave backward out (the fallback's own "
          "gradients flow through lists)");
    }
    definition->return_aliases.push_back(ret.alias_info() != nullptr);
    definition->return_alias_arguments.push_back(detail::alias_arguments_of(op.schema, ret));
    // An alias of a set no argument is in would read as a wildcard: any input could come back.
    const auto sets = alias_sets_of(ret.alias_info());
    if (sets && !sets->empty() && definition->return_alias_arguments.back().empty()) {
      const auto& arguments = op.schema.arguments();
      const bool wildcard_argument = std::any_of(arguments.begin(), arguments.end(), [](auto& a) {
        return !alias_sets_of(a.alias_info()).has_value();
      });
      std::string names;
      for (const auto& set : *sets)
        names += (names.empty() ? "'" : ", '") + std::string(set.toUnqualString()) + "'";
      TORCH_CHECK_VALUE(wildcard_argument, qualified, ": output ", i,
                        " is declared an alias of the alias set ", names,
                        ", which no argument is in; name the argument it returns a view of with "
                        "the same set (Tensor(a) x -> Tensor(a)), or drop the annotation if it "
                        "aliases no input");
    }
  }

  definition->fallback = make_piece(*definition, declared.fallback, "fallback", nullptr);
  definition->checked_fallback =
      std::make_shared<const c10::KernelFunction>(c10::KernelFunction::makeFromBoxedFunctor(
          std::make_unique<CheckedFallback>(definition, qualified)));
  if (declared.fake) {
    definition->meta = make_piece(*definition, *declared.fake, "fake", nullptr);
    definition->fake_source = FakeSource::kExplicit;
  } else if (!declared.python_module.empty()) {
    definition->fake_source = FakeSource::kPython;
    // The definition holds it, as its other pieces: a Meta kernel that torch.library registered
    // for each definition was freed by a replace while a call on meta tensors ran it (sweep 33
    // A-F1: PyTorch's internal assert on the Python object, a segfault under OPREG_DEBUG=1).
    if (declared.python_meta) {
      definition->meta = make_piece(*definition, *declared.python_meta, "fake", nullptr);
    }
  } else {
    definition->meta = make_piece(*definition, declared.fallback, "fallback(meta)", nullptr);
  }
  // PyTorch's dispatcher picks a device kernel by the tensor arguments' devices: with none, every
  // call reaches the fallback, and a kernel would be reported serving while it never runs.
  const auto& arguments = op.schema.arguments();
  const bool takes_tensors = std::any_of(arguments.begin(), arguments.end(),
                                         [](const auto& a) { return holds_tensors(*a.type()); });
  TORCH_CHECK_VALUE(declared.kernels.empty() || takes_tensors, definition->name(), ": kernel '",
                    declared.kernels.front().name, "' would never run: the schema '",
                    op.schema_text,
                    "' takes no tensor argument, and PyTorch's dispatcher picks a device's kernel "
                    "by its tensor arguments (every call runs the fallback); call the kernel from "
                    "the fallback, or take a tensor argument on the device");
  for (const auto& kernel : declared.kernels) {
    TORCH_CHECK_VALUE(!kernel.device_types || !kernel.device_types->empty(), definition->name(),
                      ": kernel '", kernel.name,
                      "' lists no device type, so it would serve nothing; name its device types "
                      "(opreg::on({\"cuda\"})), or leave them out to follow the accelerated ones");
    const auto& types = kernel.device_types ? *kernel.device_types : device_types;
    for (const auto& raw : types) {
      // Reports carry it to Python, which reads text only (sweep 38 B-F4: every describe_ops()
      // failed with UnicodeDecodeError).
      TORCH_CHECK_VALUE(detail::escaped(raw) == raw, definition->name(), ": kernel '", kernel.name,
                        "' names device type '", detail::escaped(raw),
                        "', which holds bytes that are not UTF-8 text or control characters; "
                        "name a device type like 'cuda'");
      add_kernel(*definition, kernel, normalize_device_type(raw), kernel.device_types.has_value());
    }
  }
  definition->autograd = detail::make_autograd_kernel(definition->identity, declared.autograd,
                                                      definition->checked_fallback);
  definition->vmap = detail::make_vmap_kernel(
      definition->identity, declared.vmap_rule, declared.flags,
      detail::autograd_support(declared.autograd), definition->checked_fallback);
  definition->randomness = detail::make_randomness_kernel(definition->identity, declared.flags);
  return definition;
}

// The dispatch keys a definition needs trampolines at.
std::set<c10::DispatchKey> keys_of(const Definition& definition) {
  std::set<c10::DispatchKey> keys{c10::DispatchKey::CompositeExplicitAutograd,
                                  c10::DispatchKey::Autograd, c10::DispatchKey::FuncTorchBatched};
  if (definition.meta) keys.insert(c10::DispatchKey::Meta);
  if (definition.randomness || !definition.optional_tensor_lists.empty()) {
    keys.insert(c10::DispatchKey::FuncTorchVmapMode);
  }
  for (const auto& served : definition.kernels) keys.insert(served.key);
  return keys;
}

// ---- calls -------------------------------------------------------------------------------------

// Whether `value` is of the kind `type` takes, as PyTorch's unboxing reads it (an enum within its
// values); types not named here are PyTorch's to check.
bool fits(const c10::IValue& value, const c10::Type& type) {
  if (const auto* optional = type.castRaw<c10::OptionalType>()) {
    return value.isNone() || fits(value, *optional->getElementType());
  }
  switch (type.kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      return value.isInt() || value.isSymInt();
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
      return value.isDouble() || value.isSymFloat();
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      return value.isBool() || value.isSymBool();
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
      return value.isInt() && value.toInt() >= 0 && value.toInt() < *enum_values(type);
    case c10::TypeKind::ComplexType:
      return value.isComplexDouble();
    case c10::TypeKind::StringType:
      return value.isString();
    case c10::TypeKind::DeviceObjType:
      return value.isDevice();
    case c10::TypeKind::NumberType:
      return value.isScalar();
    case c10::TypeKind::ListType: {
      const auto& element = *type.castRaw<c10::ListType>()->getElementType();
      switch (element.kind()) {
        case c10::TypeKind::IntType:
          return value.isIntList();
        case c10::TypeKind::SymIntType: {
          if (value.isIntList()) return true;
          if (!value.isList()) return false;
          const auto items = value.toListRef();
          return std::all_of(items.begin(), items.end(), [](const c10::IValue& item) {
            return item.isInt() || item.isSymInt();
          });
        }
        case c10::TypeKind::FloatType:
          return value.isDoubleList();
        case c10::TypeKind::BoolType:
          return value.isBoolList();
        case c10::TypeKind::TensorType:
          return value.isTensorList();
        default: {
          // A generic list (Tensor?[], str[], Scalar[], ...) may hold anything: its elements.
          if (!value.isList()) return false;
          for (const auto& item : value.toListRef()) {
            if (!fits(item, element)) return false;
          }
          return true;
        }
      }
    }
    case c10::TypeKind::TensorType:
      return value.isTensor();
    case c10::TypeKind::GeneratorType:
      return value.isGenerator();
    default:
      return true;
  }
}

// For a list of an enum (ScalarType[], Layout[]?, ...) that `fits` refused for an int out of the
// enum's values: which element, and why, to say in place of "got int[]" (sweep 51 B-N3: [999]
// was told it must be ScalarType[], while [6], an int[] too, is one). Empty otherwise.
std::string enum_list_difference(const c10::IValue& value, const c10::Type& type) {
  const auto* optional = type.castRaw<c10::OptionalType>();
  const auto* list = (optional ? *optional->getElementType() : type).castRaw<c10::ListType>();
  if (list == nullptr || !value.isList()) return "";
  const auto values = enum_values(*list->getElementType());
  if (!values) return "";
  const auto items = value.toListRef();
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].isInt() || (items[i].toInt() >= 0 && items[i].toInt() < *values)) continue;
    return "element " + std::to_string(i) + " is " + std::to_string(items[i].toInt()) +
           ", which is not a " + enum_name(*list->getElementType()) + " (expected 0 to " +
           std::to_string(*values - 1) + ")";
  }
  return "";
}

bool checkable(const c10::Type& type) {
  const auto* optional = type.castRaw<c10::OptionalType>();
  switch ((optional ? *optional->getElementType() : type).kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
    case c10::TypeKind::StringType:
    case c10::TypeKind::DeviceObjType:
    case c10::TypeKind::NumberType:
    case c10::TypeKind::ComplexType:
    case c10::TypeKind::GeneratorType:
    case c10::TypeKind::ListType:
      return true;
    default:
      return false;
  }
}

// A Tensor? given an undefined tensor (C++'s way of giving none) reaches the pieces as None.
void undefined_as_none(const Definition& definition, torch::jit::Stack& stack) {
  c10::IValue* first = stack.data() + (stack.size() - definition.schema().arguments().size());
  for (size_t index : definition.optional_tensors) {
    auto& value = first[index];
    if (value.isTensor() && !value.toTensor().defined()) value = c10::IValue();
  }
}

// A Tensor?[] given a List<Tensor> (a boxed C++ call's) reaches the pieces as a List<Tensor?>,
// and an undefined element of either as None, as a lone Tensor?'s (a new list: the caller's stays).
void tensor_lists_as_optional(const Definition& definition, torch::jit::Stack& stack) {
  c10::IValue* first = stack.data() + (stack.size() - definition.schema().arguments().size());
  auto undefined = [](const c10::IValue& element) {
    return element.isTensor() && !element.toTensor().defined();
  };
  for (size_t index : definition.lists_of_optional_tensors) {
    auto& value = first[index];
    if (!value.isList()) continue;
    const auto elements = value.toListRef();
    if (!value.isTensorList() && std::none_of(elements.begin(), elements.end(), undefined)) {
      continue;
    }
    c10::List<std::optional<at::Tensor>> optional;
    optional.reserve(elements.size());
    for (const auto& element : elements) {
      if (element.isTensor() && element.toTensor().defined()) {
        optional.push_back(element.toTensor());
      } else {
        optional.push_back(std::nullopt);
      }
    }
    value = std::move(optional);
  }
}

// The arguments as the pieces take them, after check_arguments.
void normalize_arguments(const Definition& definition, torch::jit::Stack& stack) {
  if (!definition.optional_tensors.empty()) undefined_as_none(definition, stack);
  if (!definition.lists_of_optional_tensors.empty()) tensor_lists_as_optional(definition, stack);
}

void check_arguments(const Definition& definition, const torch::jit::Stack& stack) {
  const auto& arguments = definition.schema().arguments();
  TORCH_CHECK(stack.size() >= arguments.size(), definition.name(), ": called with ", stack.size(),
              " arguments, expected ", arguments.size(), " (schema '", definition.schema_text(),
              "')");
  const c10::IValue* first = stack.data() + (stack.size() - arguments.size());
  for (size_t index : definition.required_tensors) {
    const auto& value = first[index];
    if (value.isTensor() && value.toTensor().defined()) continue;
    // The hint fits None alone (sweep 51 B-N17: a str was told to declare 'Tensor?').
    const bool none = value.isNone() || value.isTensor();
    TORCH_CHECK_TYPE(false, definition.name(), ": argument '", arguments[index].name(),
                     "' must be a Tensor, got ", none ? "None" : value.tagKind(),
                     none ? " (declare it 'Tensor? " + arguments[index].name() +
                                "' in the schema to accept None)"
                          : " (schema '" + definition.schema_text() + "')");
  }
  for (size_t index : definition.tensor_lists) {
    const auto& value = first[index];
    if (!value.isTensorList()) continue;  // None, or another kind: checked below
    const auto list = value.toTensorList();
    for (size_t element = 0; element < list.size(); ++element) {
      TORCH_CHECK_TYPE(list.get(element).defined(), definition.name(), ": argument '",
                       arguments[index].name(), "' holds None (an undefined tensor) at index ",
                       element, ", expected a Tensor (declare it 'Tensor?[] ",
                       arguments[index].name(), "' in the schema to accept None)");
    }
  }
  for (size_t index : definition.optional_tensors) {
    const auto& value = first[index];
    TORCH_CHECK_TYPE(value.isNone() || value.isTensor(), definition.name(), ": argument '",
                     arguments[index].name(), "' must be a Tensor or None, got ", value.tagKind(),
                     " (schema '", definition.schema_text(), "')");
  }
  for (const auto& [index, type] : definition.checked_values) {
    const auto& value = first[index];
    if (fits(value, *type)) continue;
    if (value.isInt() && enum_values(*type)) {
      TORCH_CHECK_VALUE(false, definition.name(), ": argument '", arguments[index].name(), "' is ",
                        value.toInt(), ", which is not a ", enum_name(*type), " (expected 0 to ",
                        *enum_values(*type) - 1, "; schema '", definition.schema_text(), "')");
    }
    const std::string element = enum_list_difference(value, *type);
    TORCH_CHECK_VALUE(element.empty(), definition.name(), ": argument '", arguments[index].name(),
                      "': ", element, "; schema '", definition.schema_text(), "'");
    TORCH_CHECK_TYPE(false, definition.name(), ": argument '", arguments[index].name(),
                     "' must be ", type->str(), ", got ",
                     value.isList() ? value.type()->str() : value.tagKind(), " (schema '",
                     definition.schema_text(), "')");
  }
  for (const auto& [index, expected] : definition.fixed_lengths) {
    const auto length = list_length(first[index]);
    TORCH_CHECK_VALUE(!length || *length == expected, definition.name(), ": argument '",
                      arguments[index].name(), "' has ", length.value_or(0), " elements, expected ",
                      expected, " (schema '", definition.schema_text(), "')");
  }
}

// The memory a tensor holds: the tensor itself, and its storage's bytes. Raw pointers suffice:
// every opreg kernel allocates its outputs while its inputs are alive, so an output cannot get the
// memory of an input freed during the call.
struct Memory {
  // Only of a tensor without storage (a sparse one), which the call's stack holds: a part of a
  // sparse tensor (its values, its indices) may be a temporary, whose address a later one reuses.
  const c10::TensorImpl* tensor = nullptr;
  const c10::StorageImpl* storage = nullptr;  // null for tensors without storage
  uintptr_t begin = 0;                        // 0 for storage without data (meta tensors)
  uintptr_t end = 0;

  explicit Memory(const at::Tensor& of) {
    if (!of.has_storage()) {
      tensor = of.unsafeGetTensorImpl();
      return;
    }
    c10::StorageImpl* impl = of.storage().unsafeGetStorageImpl();
    storage = impl;
    // Read past PyTorch's checks (a storage may refuse reads of its data pointer): only the
    // address is compared, and a lazy clone stays unmaterialized.
    const at::DataPtr& data = impl->_mutable_data_ptr_no_checks();
    // A lazy clone's bytes are its source's until either is written: a copy, not an alias.
    if (c10::impl::cow::is_cow_data_ptr(data)) return;
    begin = reinterpret_cast<uintptr_t>(data.get());
    // Only storage with data has a size in bytes for certain (a fake tensor's may be symbolic).
    if (begin != 0) end = begin + storage->nbytes();
  }
  // One storage, or two storages on the same bytes (numpy, DLPack or frombuffer wrap an input's
  // memory in a storage of their own). `same_device`: data pointers of other devices are not
  // comparable.
  bool shared_with(const Memory& other, bool same_device) const {
    if (tensor != nullptr && tensor == other.tensor) return true;  // the very sparse tensor
    if (storage == nullptr || other.storage == nullptr) return false;
    if (storage == other.storage) return true;
    return same_device && begin != 0 && other.begin != 0 && begin < other.end && other.begin < end;
  }
};

// A stack that call_boxed_padded passes, and the Nones it holds before the call's arguments.
thread_local const torch::jit::Stack* padded_stack = nullptr;
thread_local size_t stack_padding = 0;

size_t padding_of(const torch::jit::Stack& stack) {
  return &stack == padded_stack ? stack_padding : 0;
}

// Note [A call racing a change of schema]
// A caller reads its arguments against the schema registered at that moment (Python's parser,
// C++'s unboxed-to-boxed wrapper), then the trampoline reads the op's definition. A replace that
// changes the schema registers the new schema, then publishes the new definition: a call in
// between would run one definition on arguments read against the other schema (seen: the old
// definition took the new schema's default for its argument, and the caller's value came back
// as an extra output). So publish() counts schema changes (schema_generation) before it
// registers a schema, each definition carries the count it was published under, and a call that
// finds the two apart raises. A call that read its arguments before the change and reaches the
// trampoline after the publish is caught by its argument count: once an op's schema has changed,
// a call's stack must hold exactly its arguments (as every caller but a hand-made boxed call's
// makes it), each of its schema type (one schema's float is the other's int). Left: such a call
// whose old and new schemas take the same types in the same order.
void check_schema_current(const OpEntry& entry, const Definition& definition,
                          const torch::jit::Stack& stack) {
  if (!entry.schema_changed.load()) return;
  const size_t padding = padding_of(stack);
  TORCH_CHECK(definition.schema_generation.load() == entry.schema_generation.load(),
              definition.name(),
              ": this call raced a replace that changed the op's schema, so its arguments may "
              "have been read against the other schema (the definition it reached has '",
              definition.schema_text(), "'); call it again");
  const auto& arguments = definition.schema().arguments();
  TORCH_CHECK(
      stack.size() - padding == arguments.size(), definition.name(), ": called with ",
      stack.size() - padding, " arguments, expected ", arguments.size(), " (schema '",
      definition.schema_text(),
      "'); the op's schema was replaced: a call that raced the replace reads its arguments "
      "against the other schema, so call it again with the arguments this schema takes; a "
      "caller made for the other schema (an OpHandle typed for it, an AOTInductor package, a "
      "scripted function) must be made again for this one");
  for (size_t i = 0; i < arguments.size(); ++i) {  // one schema's float is the other's int
    const c10::IValue& value = stack[padding + i];
    TORCH_CHECK(
        value.type()->isSubtypeOf(*arguments[i].type()), definition.name(), ": argument '",
        arguments[i].name(), "' is ", value.tagKind(), ", expected ", arguments[i].type()->str(),
        " (schema '", definition.schema_text(),
        "'); the op's schema was replaced: a call that raced the replace reads its arguments "
        "against the other schema, so call it again with the arguments this schema takes; a "
        "caller made for the other schema (an OpHandle typed for it, an AOTInductor package, a "
        "scripted function) must be made again for this one");
  }
}

// Calls `f` with each tensor whose memory `tensor` holds: itself, and a sparse tensor's parts.
template <typename F>
void for_each_part(const at::Tensor& tensor, F f) {
  f(tensor);
  switch (tensor.layout()) {
    case at::kSparse:
      f(tensor._indices());
      f(tensor._values());
      return;
    case at::kSparseCsr:
    case at::kSparseBsr:
      f(tensor.crow_indices());
      f(tensor.col_indices());
      f(tensor.values());
      return;
    case at::kSparseCsc:
    case at::kSparseBsc:
      f(tensor.ccol_indices());
      f(tensor.row_indices());
      f(tensor.values());
      return;
    default:
      return;
  }
}

// What the checks of a call need of its tensor inputs.
struct InputTensor {
  Memory memory;
  c10::Device device;
  bool cpu_scalar;  // 0-dim CPU tensors mix with any device
  size_t argument;  // its index in the schema
};
using CallInputs = c10::SmallVector<InputTensor, 4>;

CallInputs inputs_of(const Definition& definition, const torch::jit::Stack& stack) {
  CallInputs inputs;
  const size_t num_args = definition.schema().arguments().size();
  const c10::IValue* first = stack.data() + (stack.size() - num_args);
  auto add = [&](const at::Tensor& tensor, size_t argument) {
    const bool cpu_scalar = tensor.dim() == 0 && tensor.device().is_cpu();
    for_each_part(tensor, [&](const at::Tensor& part) {
      inputs.push_back({Memory(part), tensor.device(), cpu_scalar, argument});
    });
  };
  for (size_t i = 0; i < num_args; ++i) {
    if (first[i].isTensor()) {
      if (first[i].toTensor().defined()) add(first[i].toTensor(), i);
    } else if (first[i].isList()) {  // Tensor[] and Tensor?[]
      for (const c10::IValue& element : first[i].toListRef()) {
        if (element.isTensor() && element.toTensor().defined()) add(element.toTensor(), i);
      }
    }
  }
  return inputs;
}

// The one device of the call's tensor arguments (0-dim CPU tensors aside, as in ATen); nullopt
// when there is none or when they are on several devices (`mixed`). Kernels are device-specific:
// unless the op declares allow_mixed_devices, a mixed call is served by the fallback, as
// torch.library's ops dispatch such calls to one device's implementation.
struct CallDevices {
  std::optional<c10::Device> device;
  bool mixed = false;
};

CallDevices devices_of(const CallInputs& inputs) {
  const InputTensor* first = nullptr;
  for (const auto& input : inputs) {
    if (input.cpu_scalar) continue;
    if (first == nullptr) {
      first = &input;
    } else if (input.device != first->device) {
      return {std::nullopt, true};
    }
  }
  return {first ? std::optional<c10::Device>(first->device) : std::nullopt, false};
}

void check_dtypes(const Definition& definition, const torch::jit::Stack& stack) {
  const size_t num_args = definition.schema().arguments().size();
  const c10::IValue* first = stack.data() + (stack.size() - num_args);
  for (const auto& [index, allowed] : definition.dtype_rules) {
    // element: the position in a Tensor[] argument, or -1 for a single Tensor.
    auto check = [&](const c10::IValue& value, int64_t element) {
      if (!value.isTensor() || !value.toTensor().defined()) return;  // None: nothing to check
      const auto dtype = value.toTensor().scalar_type();
      if (std::find(allowed.begin(), allowed.end(), dtype) != allowed.end()) return;
      std::ostringstream expected;
      for (size_t i = 0; i < allowed.size(); ++i) expected << (i ? ", " : "") << allowed[i];
      TORCH_CHECK_TYPE(false, definition.name(), ": argument '",
                       definition.schema().arguments()[index].name(), "'",
                       element < 0 ? "" : " element " + std::to_string(element), " has dtype ",
                       dtype, ", expected one of: ", expected.str());
    };
    const c10::IValue& argument = first[index];
    if (argument.isList()) {
      const auto list = argument.toListRef();
      for (size_t i = 0; i < list.size(); ++i) check(list[i], static_cast<int64_t>(i));
    } else {
      check(argument, -1);
    }
  }
}

// An output the schema declares an alias of arguments (`Tensor(a) x -> Tensor(a)`) must share
// memory with one of them: torch.compile, which trusts the schema, makes it a view of them.
// False when none of them is given (None, an empty list): the output is then held to the check
// of outputs that alias nothing.
bool check_declared_alias(const Definition& definition, const at::Tensor& output, size_t index,
                          const CallInputs& inputs, const std::string& impl) {
  const auto& allowed = definition.return_alias_arguments[index];
  if (allowed.empty()) return true;  // a wildcard: anything goes
  auto is_allowed = [&](const InputTensor& input) {
    return std::find(allowed.begin(), allowed.end(), input.argument) != allowed.end();
  };
  if (std::none_of(inputs.begin(), inputs.end(), is_allowed)) return false;
  // functorch's wrappers (grad, jvp, vmap) have no storage: their memory cannot be compared.
  if (!output.has_storage() && output.layout() == at::kStrided) return true;
  for (const auto& input : inputs) {
    if (is_allowed(input) && input.memory.storage == nullptr) return true;
  }
  const InputTensor* other = nullptr;  // a shared input the schema does not name
  bool aliased = false;
  for_each_part(output, [&](const at::Tensor& part) {
    const Memory memory(part);
    for (const auto& input : inputs) {
      if (!memory.shared_with(input.memory, input.device == output.device())) continue;
      if (is_allowed(input)) {
        aliased = true;
      } else if (other == nullptr) {
        other = &input;
      }
    }
  });
  if (aliased) return true;
  const auto& arguments = definition.schema().arguments();
  std::string named;
  for (size_t i = 0; i < allowed.size(); ++i) {
    named += (i == 0 ? "'" : ", '") + arguments[allowed[i]].name() + "'";
  }
  TORCH_CHECK(false, definition.name(), ": ", impl, " returned output ", index,
              other ? " sharing memory with argument '" + arguments[other->argument].name() + "'"
                    : std::string(" sharing memory with no input"),
              ", but the schema '", definition.schema_text(), "' declares it an alias of ", named,
              "; return a view of ", named, " (or declare no alias)");
}

// Call-time output checks that cost next to nothing: count, defined, device, no alias of an input
// where the schema declares none.
void check_output_tensor(const Definition& definition, const at::Tensor& output, size_t index,
                         const CallInputs& inputs, const std::string& impl,
                         std::optional<c10::Device> device) {
  if (device && output.device() != *device) {
    TORCH_CHECK(false, definition.name(), ": ", impl, " returned output ", index, " on ",
                output.device(), ", expected ", *device, " (the device of its inputs)");
  }
  if (definition.return_aliases[index] &&
      check_declared_alias(definition, output, index, inputs, impl)) {
    return;
  }
  for_each_part(output, [&](const at::Tensor& part) {
    const Memory memory(part);
    for (const auto& input : inputs) {
      if (!memory.shared_with(input.memory, input.device == output.device())) continue;
      TORCH_CHECK(false, definition.name(), ": ", impl, " returned output ", index,
                  " sharing memory with an input, but the schema '", definition.schema_text(),
                  definition.return_aliases[index]
                      ? "' declares it an alias of arguments this call does not give"
                      : "' declares no alias",
                  "; return a new tensor (e.g. x.clone())");
    }
  });
}

// The tensor whose memory `tensor` is: functorch's wrappers (vmap's BatchedTensor, grad's and
// jvp's TensorWrapper) have no storage of their own.
const at::Tensor& memory_holder(const at::Tensor& tensor) {
  const at::Tensor* holder = &tensor;
  while (!holder->has_storage()) {
    if (const auto* batched = at::functorch::maybeGetBatchedImpl(*holder)) {
      holder = &batched->value();
    } else if (const auto* wrapper = at::functorch::maybeGetTensorWrapper(*holder)) {
      holder = &wrapper->value();
    } else {
      break;
    }
  }
  return *holder;
}

// Two outputs on one memory, where the schema declares no alias: eager code that writes one
// sees the other change, while torch.compile, which trusts the schema, makes them apart.
struct OutputMemory {
  Memory memory;
  c10::Device device;
  size_t index;  // the output's
};

// Whether any two share memory, found in order of address: comparing each pair of a Tensor[] of
// many took quadratic time (sweep 45 B-N28: 96 s for 256k tensors).
bool any_shared(std::vector<const OutputMemory*> outputs) {
  std::sort(outputs.begin(), outputs.end(), [](const OutputMemory* a, const OutputMemory* b) {
    return std::make_tuple(a->memory.storage, a->memory.tensor) <
           std::make_tuple(b->memory.storage, b->memory.tensor);
  });
  for (size_t i = 1; i < outputs.size(); ++i) {
    if (outputs[i]->memory.shared_with(outputs[i - 1]->memory, false)) return true;
  }
  outputs.erase(
      std::remove_if(outputs.begin(), outputs.end(),
                     [](const OutputMemory* output) { return output->memory.begin == 0; }),
      outputs.end());
  std::sort(outputs.begin(), outputs.end(), [](const OutputMemory* a, const OutputMemory* b) {
    return std::make_tuple(a->device.type(), a->device.index(), a->memory.begin) <
           std::make_tuple(b->device.type(), b->device.index(), b->memory.begin);
  });
  for (size_t i = 1, reach = 0; i < outputs.size(); ++i) {  // reach: the furthest end before i
    if (outputs[i]->device != outputs[i - 1]->device) {
      reach = i;
      continue;
    }
    if (outputs[reach]->memory.end < outputs[i - 1]->memory.end) reach = i - 1;
    if (outputs[i]->memory.begin < outputs[reach]->memory.end) return true;
  }
  return false;
}

void check_outputs_apart(const Definition& definition, const torch::jit::Stack& stack, size_t base,
                         const std::string& impl) {
  const size_t count = definition.schema().returns().size();
  detail::check_outputs_apart(definition.name(), definition.schema_text(),
                              c10::ArrayRef<c10::IValue>(stack).slice(base, count),
                              definition.return_aliases, impl);
}

void check_outputs(const Definition& definition, const torch::jit::Stack& stack, size_t base,
                   const CallInputs& inputs, const std::string& impl,
                   std::optional<c10::Device> device) {
  const auto& returns = definition.schema().returns();
  TORCH_CHECK(stack.size() == base + returns.size(), definition.name(), ": ", impl, " returned ",
              stack.size() - std::min(stack.size(), base), " values, expected ", returns.size(),
              " (schema '", definition.schema_text(), "')");
  for (const auto& [index, type] : definition.checked_returns) {
    const auto& value = stack[base + index];
    if (fits(value, *type) || (value.isInt() && enum_values(*type))) continue;
    const std::string element = enum_list_difference(value, *type);
    TORCH_CHECK_VALUE(element.empty(), definition.name(), ": ", impl,
                      " returned a list for output ", index, " whose ", element, "; schema '",
                      definition.schema_text(), "'");
    TORCH_CHECK_TYPE(false, definition.name(), ": ", impl, " returned ",
                     value.isList() ? value.type()->str() : value.tagKind(), " for output ", index,
                     ", expected ", type->str(), " (schema '", definition.schema_text(), "')");
  }
  for (size_t index : definition.plain_tensor_returns) {
    const auto& value = stack[base + index];
    TORCH_CHECK_TYPE(value.isTensor() && value.toTensor().defined(), definition.name(), ": ", impl,
                     " returned ", value.isTensor() || value.isNone() ? "None" : value.tagKind(),
                     " for output ", index, ", expected a Tensor (schema '",
                     definition.schema_text(), "')");
    check_output_tensor(definition, value.toTensor(), index, inputs, impl, device);
  }
  for (size_t index : definition.other_tensor_returns) {
    const auto& value = stack[base + index];
    if (value.isTensor()) {
      if (value.toTensor().defined())
        check_output_tensor(definition, value.toTensor(), index, inputs, impl, device);
    } else if (value.isList()) {  // Tensor[] and Tensor?[]
      const bool optional_elements =
          definition.schema().returns()[index].type()->isSubtypeOf(
              *c10::ListType::ofOptionalTensors()) &&
          !definition.schema().returns()[index].type()->isSubtypeOf(*c10::ListType::ofTensors());
      const auto elements = value.toListRef();
      for (size_t i = 0; i < elements.size(); ++i) {
        const c10::IValue& element = elements[i];
        if (element.isTensor() && element.toTensor().defined()) {
          check_output_tensor(definition, element.toTensor(), index, inputs, impl, device);
        } else {  // C++ code can put an undefined tensor in a Tensor[]: Python would see None
          TORCH_CHECK_TYPE(optional_elements, definition.name(), ": ", impl, " returned output ",
                           index, " holding ", element.isTensor() ? "an undefined tensor" : "None",
                           " at element ", i, ", expected a Tensor (schema '",
                           definition.schema_text(), "')");
        }
      }
    }
  }
  for (const auto& [index, values] : definition.enum_returns) {
    const auto& value = stack[base + index];
    if (!value.isInt()) continue;  // None of an optional one
    TORCH_CHECK_VALUE(value.toInt() >= 0 && value.toInt() < values, definition.name(), ": ", impl,
                      " returned ", value.toInt(), " for output ", index, ", which is no ",
                      enum_name(*definition.schema().returns()[index].real_type()),
                      " (expected 0 to ", values - 1, "; schema '", definition.schema_text(), "')");
  }
  auto check_utf8 = [&](const c10::IValue& value, size_t index, const std::string& where) {
    if (!value.isString()) return;  // None of an optional one
    const auto text = value.toStringView();
    TORCH_CHECK_VALUE(detail::valid_utf8(text) == text, definition.name(), ": ", impl,
                      " returned a str for output ", index, where, " that is not UTF-8 ('",
                      detail::valid_utf8(text), "'), which Python cannot read (schema '",
                      definition.schema_text(), "')");
  };
  for (size_t index : definition.string_returns) {
    const auto& value = stack[base + index];
    if (!value.isList()) {
      check_utf8(value, index, "");
      continue;
    }
    const auto elements = value.toListRef();
    for (size_t i = 0; i < elements.size(); ++i) {
      check_utf8(elements[i], index, " at element " + std::to_string(i));
    }
  }
  for (const auto& [index, expected] : definition.fixed_length_returns) {
    const auto length = list_length(stack[base + index]);
    TORCH_CHECK_VALUE(!length || *length == expected, definition.name(), ": ", impl, " returned ",
                      length.value_or(0), " elements for output ", index, ", expected ", expected,
                      " (schema '", definition.schema_text(), "')");
  }
  if (definition.plain_tensor_returns.size() + definition.other_tensor_returns.size() > 1 ||
      !definition.other_tensor_returns.empty()) {  // more than one tensor can come back
    check_outputs_apart(definition, stack, base, impl);
  }
}

}  // namespace

void detail::check_outputs_apart(const std::string& op, const std::string& schema_text,
                                 c10::ArrayRef<c10::IValue> outputs_given,
                                 const std::vector<bool>& declared_alias, const std::string& impl) {
  std::vector<OutputMemory> outputs;
  auto add = [&](const c10::IValue& value, size_t index) {
    if (declared_alias[index] || !value.isTensor()) return;
    const at::Tensor& tensor = memory_holder(value.toTensor());
    if (!tensor.defined() || !tensor.has_storage()) return;
    outputs.push_back({Memory(tensor), tensor.device(), index});
  };
  for (size_t index = 0; index < outputs_given.size() && index < declared_alias.size(); ++index) {
    const c10::IValue& value = outputs_given[index];
    if (value.isList()) {
      for (const c10::IValue& element : value.toListRef()) add(element, index);
    } else {
      add(value, index);
    }
  }
  if (outputs.size() < 2) return;
  if (outputs.size() > 16) {
    std::vector<const OutputMemory*> found;
    found.reserve(outputs.size());
    for (const auto& output : outputs) found.push_back(&output);
    if (!any_shared(std::move(found))) return;
  }
  for (size_t later = 1; later < outputs.size(); ++later) {  // which ones, as they come
    const auto& [memory, device, index] = outputs[later];
    for (size_t earlier = 0; earlier < later; ++earlier) {
      const auto& other = outputs[earlier];
      if (!memory.shared_with(other.memory, device == other.device)) continue;
      TORCH_CHECK(other.index != index, op, ": ", impl, " returned two tensors in output ", index,
                  " sharing memory, but the schema '", schema_text,
                  "' declares no alias; return separate tensors (e.g. y.clone())");
      TORCH_CHECK(false, op, ": ", impl, " returned outputs ", other.index, " and ", index,
                  " sharing memory, but the schema '", schema_text,
                  "' declares no alias; return separate tensors (e.g. y.clone())");
    }
  }
}

// OPREG_DEBUG=1: every call of the fallback or a kernel is also run through the op's fake on meta
// tensors, and the shapes and dtypes must agree (opcheck does the same on samples).
bool detail::debug_checks() {
  static const bool enabled = [] {
    const char* value = std::getenv("OPREG_DEBUG");
    return value != nullptr && std::string(value) == "1";
  }();
  return enabled;
}

namespace {

// The call's arguments with meta tensors in place of real ones, in lists too; nullopt when a
// tensor is already meta or belongs to a tensor subclass or mode (fake tensors) or to vmap, or when
// the call has no tensor (its dispatch would not reach the fake, but this very check again, without
// end): then there is nothing to compare.
std::optional<torch::jit::Stack> meta_arguments(const Definition& definition,
                                                const torch::jit::Stack& stack) {
  const size_t num_args = definition.schema().arguments().size();
  bool any_tensor = false;
  bool comparable = true;
  auto to_meta = [&](const c10::IValue& value) -> c10::IValue {
    if (!value.isTensor() || !value.toTensor().defined()) return value;
    const auto& tensor = value.toTensor();
    any_tensor = true;
    // Batched tensors: the fallback under vmap, which src/core/vmap.cpp compares per example.
    if (tensor.is_meta() || tensor.key_set().has(c10::DispatchKey::Python) ||
        tensor.key_set().has(c10::DispatchKey::FuncTorchBatched) ||
        tensor.layout() != at::kStrided) {
      comparable = false;
      return value;
    }
    return at::empty_strided(tensor.sizes(), tensor.strides(), tensor.options().device(at::kMeta));
  };
  torch::jit::Stack meta;
  for (auto it = stack.end() - num_args; it != stack.end(); ++it) {
    if (it->isTensorList()) {
      c10::List<at::Tensor> tensors;
      for (const at::Tensor& element : it->toTensorList()) {
        tensors.push_back(to_meta(element).toTensor());
      }
      meta.emplace_back(std::move(tensors));
    } else if (it->isList()) {  // Tensor?[]: tensors and None
      auto list = it->toList();
      c10::impl::GenericList converted(list.elementType());
      for (const c10::IValue& element : list) converted.push_back(to_meta(element));
      meta.emplace_back(std::move(converted));
    } else {
      meta.push_back(to_meta(*it));
    }
  }
  if (!any_tensor || !comparable) return std::nullopt;
  return meta;
}

// Whether a fake's error on meta tensors says it cannot run there, rather than that it is wrong:
// a data-dependent size (get_ctx() is None outside FakeTensorMode), or an output placed off meta.
// The signs are torch's own texts: a data-dependent op's meta function ("data-independent",
// "NotImplementedError"), an op without one ("with Meta tensors"), Tensor.item() on meta, a tensor
// the fake made on the CPU met with a meta one.
bool cannot_run_on_meta(const std::string& why) {
  for (const char* sign :
       {"new_dynamic_size", "DynamicOutputShape", "data-dependent", "data dependent",
        "data-independent", "NotImplementedError", "with Meta tensors", "on meta tensors",
        "a meta tensor", ", expected meta", "expected device meta", "on device meta",
        "devices, meta and", "devices, cpu and meta"}) {
    if (why.find(sign) != std::string::npos) return true;
  }
  return false;
}

void compare_with_fake_outputs(const Definition& definition, const c10::OperatorHandle& op,
                               torch::jit::Stack meta, const torch::jit::Stack& stack, size_t base,
                               const std::string& impl) {
  // The fake is reached through the dispatcher, so it is the current definition's: a call that
  // raced a replace has no fake of its own definition to compare with.
  auto still_current = [&] {
    return detail::definition_serial(definition.name()) == definition.serial;
  };
  if (!still_current()) return;
  // A fake that cannot run on meta copies of the arguments has nothing to compare: one with a
  // data-dependent output size (meta tensors have no ShapeEnv, as with torch's), one that places
  // its output by a Device argument or a factory's default device, a fallback without a fake
  // that needs data. opcheck's fake_vs_real checks such fakes under FakeTensorMode. Any other
  // failure of a fake is the fake's mistake, which torch.compile would meet.
  try {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset);
    detail::call_boxed_padded(op, &meta);
  } catch (const std::exception& error) {  // c10's errors, and Python's from a Python fake
    std::string why = detail::message_of(error);
    if (definition.fake_source == FakeSource::kFallbackOnMeta || cannot_run_on_meta(why) ||
        dynamic_cast<const c10::NotImplementedError*>(&error) != nullptr) {
      return;
    }
    why = why.substr(0, why.find("\n\nAt:\n"));  // a Python fake's stack is not the point
    TORCH_CHECK(false, "OPREG_DEBUG: ", definition.name(), ": ", impl,
                " ran, but the op's fake failed on meta copies of the call's arguments: ", why);
  }
  if (!still_current()) return;
  auto same = [&](const at::Tensor& fake, const at::Tensor& real, const std::string& what) {
    TORCH_CHECK(fake.defined() == real.defined(), "OPREG_DEBUG: ", definition.name(), ": ", impl,
                " returned ", what, (real.defined() ? " defined" : " None"),
                ", but the op's fake gives ", (fake.defined() ? "a tensor" : "None"));
    // A nested tensor has no shape to compare, and none on meta tensors (sweep 34 A-F3).
    if (!real.defined() || real.is_nested() || fake.is_nested()) return;
    TORCH_CHECK(fake.sizes() == real.sizes() && fake.scalar_type() == real.scalar_type(),
                "OPREG_DEBUG: ", definition.name(), ": ", impl, " returned ", what, " of shape ",
                real.sizes(), " and dtype ", real.scalar_type(), ", but the op's fake gives shape ",
                fake.sizes(), " and dtype ", fake.scalar_type());
  };
  const auto& returns = definition.schema().returns();
  for (size_t index = 0; index < returns.size(); ++index) {
    const c10::IValue& fake = meta[index];
    const c10::IValue& real = stack[base + index];
    const std::string what = "output " + std::to_string(index);
    if (fake.isList() && real.isList()) {  // Tensor[] and Tensor?[] (None elements)
      const auto fakes = fake.toListRef();
      const auto reals = real.toListRef();
      TORCH_CHECK(fakes.size() == reals.size(), "OPREG_DEBUG: ", definition.name(), ": ", impl,
                  " returned ", what, " with ", reals.size(),
                  real.isTensorList() ? " tensors" : " elements", ", but the op's fake gives ",
                  fakes.size());
      auto tensor_or_none = [](const c10::IValue& element) {
        return element.isTensor() ? element.toTensor() : at::Tensor();
      };
      for (size_t i = 0; i < reals.size(); ++i) {
        if (!(fakes[i].isTensor() || fakes[i].isNone()) ||
            !(reals[i].isTensor() || reals[i].isNone())) {
          continue;  // not a tensor list: numbers, compared by opcheck
        }
        same(tensor_or_none(fakes[i]), tensor_or_none(reals[i]),
             what + " element " + std::to_string(i));
      }
    } else if ((fake.isTensor() || fake.isNone()) && (real.isTensor() || real.isNone())) {
      same(fake.isTensor() ? fake.toTensor() : at::Tensor(),
           real.isTensor() ? real.toTensor() : at::Tensor(), what);
    }
  }
}

[[noreturn]] void throw_undefined(const OpEntry& entry) {
  TORCH_CHECK(false, entry.qualified,
              ": the op is not defined now (it was undefined, or its definition was rolled back "
              "when its library failed to load); define it again to call it");
}

// Runs one piece of the op (the fallback, a kernel, the fake) with the checks of a call around
// it: dtypes of the arguments before, outputs after.
void run_checked(const Definition& d, const c10::KernelFunction& function, const std::string& impl,
                 const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack,
                 const CallInputs& inputs, const CallDevices& devices, bool compare_with_fake) {
  const std::optional<c10::Device>& device = devices.device;
  check_dtypes(d, *stack);
  const size_t base = stack->size() - d.schema().arguments().size();
  std::optional<torch::jit::Stack> meta;
  if (compare_with_fake && detail::debug_checks()) meta = meta_arguments(d, *stack);
  // ATen's own messages ("The size of tensor a ...") do not say which op's code raised them;
  // opreg's do. A piece a KernelFactory built boxed throws what it throws (sweep 43 B-F4): said
  // with the op and the piece as a typed piece's throw is.
  detail::run_user_code_named<void>(d.name(), impl, [&] { function.callBoxed(op, keys, stack); });
  check_outputs(d, *stack, base, inputs, impl, device);
  if (meta) compare_with_fake_outputs(d, op, std::move(*meta), *stack, base, impl);
}

const std::string& fallback_words(const Definition& d) {
  static const auto& kFallback = *new std::string("the fallback");
  return d.spec.fallback_words.empty() ? kFallback : d.spec.fallback_words;
}

void run_checked_fallback(const Definition& d, const c10::OperatorHandle& op,
                          c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const CallInputs inputs = inputs_of(d, *stack);
  // Compared too: the fallback under autograd (an input requiring grad) and under vmap are the
  // calls of a training step.
  run_checked(d, d.fallback, fallback_words(d), op, keys, stack, inputs, devices_of(inputs),
              /*compare_with_fake=*/true);
}

// Note [A call dispatched while its schema is registered anew]
// PyTorch's dispatcher reads a call's dispatch keys from its arguments through the op's schema.
// While a replace registers the schema anew (another text, tags or fake module: see
// reregisters_schema) the op has none for a moment, and a call on another thread then reads no
// keys at all: the dispatcher sends it straight to the fallback's kernel, past autograd and vmap
// (sweep 39 b19-2: a gradient through the fallback's ops instead of the op's backward). Such a call
// reaches the fallback's trampoline with keys that lack the backend its tensors have; it waits
// for the publish to end (publishes hold the registry's lock) and is dispatched again.
thread_local int dispatches_again = 0;

bool dispatched_without_argument_keys(const Definition& d, c10::DispatchKeySet keys,
                                      const torch::jit::Stack& stack) {
  if (keys.highestBackendKey() != c10::BackendComponent::InvalidBit) return false;
  const auto from_arguments =
      c10::DispatchKeyExtractor::make(d.schema()).getDispatchKeySetBoxed(&stack);
  return from_arguments.highestBackendKey() != c10::BackendComponent::InvalidBit;
}

void dispatch_again(const Definition& d, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  {
    const std::lock_guard<std::recursive_mutex> publish_ended(registry().mutex);
  }
  TORCH_CHECK(dispatches_again < 3, d.name(),
              ": the dispatcher passed this call none of its tensors' dispatch keys, again after "
              "the op's schema was registered anew; call it again");
  ++dispatches_again;
  const auto done = c10::make_scope_exit([] { --dispatches_again; });
  op.callBoxed(stack);
}

// Note [Tensors only in a Tensor[]?]
// PyTorch's dispatcher computes a call's dispatch keys from its Tensor, Tensor?, Tensor[] and
// Tensor?[] arguments, not from a Tensor[]? one. Under vmap, when the only batched tensors are in
// such a list, the call would miss FuncTorchBatched and reach functorch's lower levels with
// batched tensors (an internal assert). Ops with a Tensor[]? argument have a kernel at
// FuncTorchVmapMode, which every call under vmap passes, that sends such a call on to the op's
// batching kernel.
bool batched_only_in_lists(const Definition& d, const torch::jit::Stack& stack) {
  if (d.optional_tensor_lists.empty()) return false;
  const auto layer = at::functorch::maybeCurrentDynamicLayer();
  if (!layer.has_value()) return false;
  const c10::IValue* first = stack.data() + (stack.size() - d.schema().arguments().size());
  for (size_t index : d.optional_tensor_lists) {
    const auto& value = first[index];
    if (!value.isTensorList()) continue;
    for (const at::Tensor& tensor : value.toTensorVector()) {
      if (tensor.defined() && at::functorch::isBatchedAtLevel(tensor, layer->layerId())) {
        return true;
      }
    }
  }
  return false;
}

// The kernel the dispatcher calls at `key` for one op: see Note [Definitions are immutable].
class Trampoline final : public c10::OperatorKernel {
 public:
  Trampoline(const OpEntry* entry, c10::DispatchKey key) : entry_(entry), key_(key) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const CallInFlight call(*entry_, key_ != c10::DispatchKey::Autograd);
    const Definition* definition = call.definition();
    if (definition == nullptr) throw_undefined(*entry_);
    const Definition& d = *definition;
    if (!call.pinned()) check_schema_current(*entry_, d, *stack);
    if (key_ == c10::DispatchKey::CompositeExplicitAutograd && !call.pinned() &&
        dispatched_without_argument_keys(d, keys, *stack)) {
      // See Note [A call dispatched while its schema is registered anew].
      dispatch_again(d, op, stack);
      return;
    }
    check_arguments(d, *stack);
    normalize_arguments(d, *stack);
    switch (key_) {
      case c10::DispatchKey::Autograd: {
        const PinDefinition pin(*entry_, definition);
        d.autograd.callBoxed(op, keys, stack);
        return;
      }
      case c10::DispatchKey::FuncTorchBatched:
        d.vmap.callBoxed(op, keys, stack);
        return;
      case c10::DispatchKey::FuncTorchVmapMode:
        if (!keys.has(c10::DispatchKey::FuncTorchBatched) && batched_only_in_lists(d, *stack)) {
          TORCH_CHECK(!d.randomness, d.name(),
                      ": under vmap, a random op's batched tensors must not all be in a Tensor[]? "
                      "argument; declare it Tensor[] or Tensor?[], or batch another argument");
          op.redispatchBoxed((keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER,
                                                         c10::DispatchKey::FuncTorchVmapMode))
                                 .add(c10::DispatchKey::FuncTorchBatched),
                             stack);
          return;
        }
        if (d.randomness) {
          d.randomness->callBoxed(op, keys, stack);
        } else {
          c10::impl::ExcludeDispatchKeyGuard guard(c10::DispatchKey::FuncTorchVmapMode);
          op.callBoxed(stack);
        }
        return;
      case c10::DispatchKey::Meta:
        run_meta(d, op, keys, stack);
        return;
      default:
        break;
    }
    const CallInputs inputs = inputs_of(d, *stack);
    const ServedKernel* served =
        key_ == c10::DispatchKey::CompositeExplicitAutograd ? nullptr : d.kernel_at(key_);
    const CallDevices devices = devices_of(inputs);
    if (served != nullptr && !d.spec.flags.allow_mixed_devices && devices.mixed) {
      served = nullptr;  // a kernel serves one device: the fallback takes calls across devices
    }
    // As ATen's own ops do: the call's device is current while its pieces run (a Triton JIT
    // launch, say, goes to the current device, not to its tensors' device). See Note [A device
    // guard only where the device is not current] in src/triton/kernel.cpp.
    c10::OptionalDeviceGuard device_guard;
    if (devices.device && !devices.device->is_cpu() &&
        c10::impl::getDeviceGuardImpl(devices.device->type())->getDevice() != *devices.device) {
      device_guard.reset_device(*devices.device);
    }
    if (served == nullptr) {
      run_checked(d, d.fallback, fallback_words(d), op, keys, stack, inputs, devices,
                  /*compare_with_fake=*/true);
    } else {
      run_checked(d, served->function, served->label, op, keys, stack, inputs, devices,
                  /*compare_with_fake=*/true);
    }
  }

 private:
  inline static const std::string& kFake = *new std::string("the fake");

  // A call with a meta tensor among real ones is served at Meta, as torch.library serves it: it
  // computes shapes, not values. A fake that then returns a real tensor (`empty_like` of the CPU
  // argument) would hand out uninitialised memory as a result.
  static void check_meta_outputs(const Definition& d, const torch::jit::Stack& stack,
                                 const std::string& piece) {
    const size_t returns = d.schema().returns().size();
    for (size_t i = 0; i < returns; ++i) {
      const c10::IValue& output = stack[stack.size() - returns + i];
      std::vector<at::Tensor> tensors;
      if (output.isTensor()) {
        tensors.push_back(output.toTensor());
      } else if (output.isTensorList()) {
        tensors = output.toTensorVector();
      }
      for (const auto& tensor : tensors) {
        TORCH_CHECK(!tensor.defined() || tensor.is_meta(), d.name(), ": ", piece,
                    " returned output ", i, " on ", tensor.device(),
                    " for a call with a meta tensor among its arguments; such a call computes "
                    "shapes, not values, so its outputs must be meta tensors (its values would be "
                    "uninitialised memory). Put every tensor argument on one device");
      }
    }
  }

  // Without an explicit fake, the fallback runs on meta tensors; when it cannot, the error says
  // that the op needs a fake.
  static void run_meta(const Definition& d, const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                       torch::jit::Stack* stack) {
    if (!d.meta) {
      detail::throw_no_fake(d.name(), "its fake is registered from Python and is not there");
    }
    const CallInputs inputs = inputs_of(d, *stack);
    const CallDevices devices = devices_of(inputs);
    if (devices.mixed) {  // a meta tensor beside real ones: whatever fails, say so
      const std::string piece = d.fake_source == FakeSource::kFallbackOnMeta
                                    ? "the fallback on meta tensors"
                                    : "the fake";
      std::string why;
      try {
        run_checked(d, *d.meta, piece, op, keys, stack, inputs, devices,
                    /*compare_with_fake=*/false);
        check_meta_outputs(d, *stack, piece);
        return;
      } catch (const c10::Error& error) {
        why = error.what_without_backtrace();
      } catch (const std::exception& error) {  // a Python piece raised
        why = detail::message_of(error);
        why = why.substr(0, why.find("\n\nAt:\n"));  // its Python stack is not the point
      }
      TORCH_CHECK(
          false, d.name(), ": ", piece,
          " failed on a call with tensors on several devices (a meta tensor among them): ", why);
    }
    if (d.fake_source != FakeSource::kFallbackOnMeta) {
      run_checked(d, *d.meta, kFake, op, keys, stack, inputs, devices,
                  /*compare_with_fake=*/false);
      return;
    }
    check_dtypes(d, *stack);
    TORCH_CHECK_NOT_IMPLEMENTED(!d.device_return, d.name(),
                                ": has no fake, and its fallback run on meta tensors would give "
                                "'meta' for the Device of output ",
                                d.device_return.value_or(0),
                                ", not the device a real call gives; give the op a fake "
                                "(.fake(fn) in C++, fake_fn= in Python)");
    const size_t base = stack->size() - d.schema().arguments().size();
    try {
      d.meta->callBoxed(op, keys, stack);
    } catch (const c10::Error& error) {
      detail::throw_no_fake(d.name(), error.what_without_backtrace());
    } catch (const std::exception& error) {  // a Python fallback raised
      detail::throw_no_fake(d.name(), detail::message_of(error));
    }
    check_outputs(d, *stack, base, inputs, "the fallback on meta tensors", devices.device);
  }

  const OpEntry* entry_;
  c10::DispatchKey key_;
};

// ---- publishing --------------------------------------------------------------------------------

// The tags an op's flags give its schema: what torch.compile reads (cudagraph trees skip ops
// tagged cudagraph_unsafe).
std::vector<at::Tag> tags_of(const OpFlags& flags) {
  std::vector<at::Tag> tags;
  if (flags.cuda_graph_unsafe) tags.push_back(at::Tag::cudagraph_unsafe);
  return tags;
}

// Whether publishing `definition` registers its schema anew over the one registered: another
// text, another fake module or other tags all deregister the old schema.
bool reregisters_schema(const OpEntry::Registered& registered, const Definition& definition) {
  return registered.text != definition.schema_text() ||
         registered.python_module != definition.spec.python_module ||
         registered.tags != tags_of(definition.spec.flags);
}

void register_schema(OpEntry& entry, const c10::FunctionSchema& schema,
                     const std::string& python_module, const std::vector<at::Tag>& tags) {
  auto library = std::make_unique<torch::Library>(torch::Library::FRAGMENT, entry.ns, std::nullopt,
                                                  "opreg", 0);
  if (!python_module.empty()) {
    // The dispatcher keeps the pointer: the text must outlive every definition.
    static auto* modules = new std::set<std::string>();
    library->set_python_module(modules->insert(python_module).first->c_str());
  }
  try {
    library->def(c10::FunctionSchema(schema), tags);
  } catch (const c10::Error& error) {
    TORCH_CHECK_VALUE(false, entry.qualified,
                      ": cannot define the op: ", error.what_without_backtrace());
  }
  std::ostringstream text;
  text << schema;
  entry.schema_library = std::move(library);
  entry.registered = OpEntry::Registered{text.str(), schema, python_module, tags};
}

void add_trampoline(OpEntry& entry, c10::DispatchKey key) {
  auto functor = c10::BoxedKernel::makeFromFunctor(std::make_unique<Trampoline>(&entry, key));
  auto library = std::make_unique<torch::Library>(torch::Library::FRAGMENT, entry.ns, std::nullopt,
                                                  "opreg", 0);
  try {
    library->impl(entry.op_name.c_str(),
                  torch::dispatch(key, torch::CppFunction::makeFromBoxedKernel(functor)));
  } catch (const c10::Error& error) {
    TORCH_CHECK_VALUE(false, entry.qualified, ": cannot register at dispatch key ",
                      c10::toString(key), ": ", error.what_without_backtrace());
  }
  entry.functors.push_back(std::move(functor));
  entry.trampolines.emplace(key, std::move(library));
}

// Makes `definition` the op's current one (nullptr: undefined). Returns the one it replaced.
// On an error nothing has changed: the schema is registered anew (restoring the old one if the
// new one is refused) and trampolines are added before the swap; the only steps after the swap,
// removing trampolines no longer needed, do not fail.
DefinitionPtr publish(OpEntry& entry, DefinitionPtr definition,
                      std::vector<DefinitionPtr>* garbage) {
  DefinitionPtr previous = entry.load();
  auto store = [&](DefinitionPtr next) {
    const bool rebuild = next && previous && next->serial == previous->serial;
    entry.last_change.before = entry.changes;
    if (!rebuild) ++entry.changes;
    entry.last_change.after = entry.changes;
    auto unreachable = entry.store(std::move(next));
    garbage->insert(garbage->end(), unreachable.begin(), unreachable.end());
  };
  if (!definition) {
    store(nullptr);
    return previous;
  }
  const auto tags = tags_of(definition->spec.flags);
  const auto earlier = entry.registered;
  const uint64_t generation = entry.schema_generation.load();
  auto restore_schema = [&] {
    if (earlier) {
      register_schema(entry, earlier->schema, earlier->python_module, earlier->tags);
    } else {
      entry.registered.reset();
    }
    entry.schema_generation = generation;
  };
  const bool registers = !earlier || reregisters_schema(*earlier, *definition);
  if (registers) {
    if (earlier && earlier->text != definition->schema_text()) {
      entry.schema_changed = true;
      entry.schema_generation = generation + 1;  // before calls can read the new schema
    }
    entry.schema_library.reset();  // the entry stays: trampolines are registered on it
    try {
      register_schema(entry, definition->schema(), definition->spec.python_module, tags);
    } catch (...) {
      restore_schema();
      throw;
    }
  }
  const auto keys = keys_of(*definition);
  std::vector<c10::DispatchKey> added;
  try {
    for (auto key : keys) {
      if (entry.trampolines.count(key)) continue;
      add_trampoline(entry, key);
      added.push_back(key);
    }
  } catch (...) {
    for (auto key : added) entry.trampolines.erase(key);
    if (registers) {
      entry.schema_library.reset();
      restore_schema();
    }
    throw;
  }
  definition->schema_generation = entry.schema_generation.load();
  store(definition);
  for (auto it = entry.trampolines.begin(); it != entry.trampolines.end();) {
    it = keys.count(it->first) ? std::next(it) : entry.trampolines.erase(it);
  }
  return previous;
}

OpEntry& entry_for(Registry& reg, const Definition& definition) {
  const std::string& qualified = definition.name();
  auto found = reg.ops.find(qualified);
  if (found != reg.ops.end()) return *found->second;
  auto* entry = new OpEntry();  // never freed: see Note [Definitions are immutable]
  entry->qualified = qualified;
  std::string name, overload;
  split_name(qualified, qualified, &entry->ns, &name, &overload);
  entry->op_name = qualified.substr(entry->ns.size() + 2);
  reg.ops.emplace(qualified, entry);
  return *entry;
}

// Refuses what may not be published: a name taken by an earlier opreg op (unless replacing) or
// by an op defined outside opreg.
// A part of an op (its vmap_fn companion) that the op still calls is replaced with the op:
// replaced on its own, the op's vmapped calls found it changed and said every one raced a
// replace (sweep 45 B-F4). As undefine_now refuses to undefine it alone.
void check_parts_stay_with_their_owners(Registry& reg,
                                        const std::map<std::string, Definition*>& built) {
  for (const auto& [name, definition] : built) {
    auto found = reg.ops.find(name);
    const auto current = found == reg.ops.end() ? nullptr : found->second->load();
    if (current == nullptr || !current->spec.part_of) continue;
    const std::string& owner = *current->spec.part_of;
    auto owner_entry = reg.ops.find(owner);
    const auto owner_now = owner_entry == reg.ops.end() ? nullptr : owner_entry->second->load();
    const bool still_its_part = owner_now != nullptr && owner_now->serial == current->owner_serial;
    TORCH_CHECK_VALUE(!still_its_part || built.count(owner) != 0, name,
                      ": cannot replace it on its own: it is part of '", owner,
                      "' (such as its vmap_fn companion), which calls it; define '", owner,
                      "' again (with it, or without it and then define this name)");
  }
}

void check_publishable(Registry& reg, const Definition& definition) {
  const std::string& qualified = definition.name();
  auto found = reg.ops.find(qualified);
  if (found != reg.ops.end()) {
    auto current = found->second->load();
    TORCH_CHECK_VALUE(!current || definition.spec.replace, qualified,
                      ": an op of this name is already defined (by ",
                      current ? current->origin : "",
                      "); pass replace=True (.replace() in C++) to replace it");
    const auto& only = definition.spec.replace_only;
    TORCH_CHECK_VALUE(!only || current || *only == 0, qualified,
                      ": the op was undefined while this definition was made, and it replaces only "
                      "the op's earlier definition; define the op again");
    // Serials only grow: a later one than the op's is none it had (sweep 46 B: a bogus serial
    // was said to be a definition made meanwhile).
    TORCH_CHECK_VALUE(!only || !current || *only <= current->serial, qualified, ": replace_only(",
                      *only,
                      ") names no definition this op had (its "
                      "definition now is serial ",
                      current ? current->serial : 0,
                      "); give the serial of the definition it replaces "
                      "(opreg::detail::definition_serial)");
    TORCH_CHECK_VALUE(!only || (current ? current->serial : 0) == *only, qualified,
                      ": an op of this name was defined (by ", current ? current->origin : "",
                      ", serial ", current ? current->serial : 0,
                      ") while this definition was made, and it replaces only the op's earlier "
                      "definition (serial ",
                      only ? *only : 0, "); choose another name, or replace it explicitly");
    return;
  }
  // Sweep 50 B-RO3: it was defined.
  const auto& only = definition.spec.replace_only;
  TORCH_CHECK_VALUE(!only || *only == 0, qualified, ": replace_only(", only ? *only : 0,
                    ") replaces the op's definition of that serial, but no op of this name was "
                    "ever defined; define it without replace_only");
  auto known = c10::Dispatcher::singleton().findSchema(
      {definition.schema().name(), definition.schema().overload_name()});
  TORCH_CHECK_VALUE(!known.has_value(), qualified,
                    ": an op of this name is already defined outside opreg (",
                    known ? known->debug() : "", "); opreg cannot replace it");
}

OpReport report_of(const Definition& definition) {
  OpReport report;
  const auto& spec = definition.spec;
  report.name = definition.name();
  report.schema = definition.schema_text();
  report.origin = definition.origin;
  report.kernels = definition.serving;
  report.fake = definition.fake_source;
  report.autograd = detail::autograd_support(spec.autograd);
  report.vmap = detail::vmap_support(spec.vmap_rule, spec.flags);
  report.flags = spec.flags;
  report.sharding = definition.sharding;
  for (const auto& [index, dtypes] : definition.dtype_rules) {
    std::vector<std::string> names;
    for (auto dtype : dtypes) names.emplace_back(c10::toString(dtype));
    report.dtypes.emplace_back(definition.schema().arguments()[index].name(), names);
  }
  return report;
}

DefinitionPtr current_definition(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  auto found = reg.ops.find(name);
  DefinitionPtr definition = found == reg.ops.end() ? nullptr : found->second->load();
  TORCH_CHECK_VALUE(definition != nullptr, "opreg: no op named '", name, "' is defined by opreg",
                    default_overload_hint(name));
  return definition;
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

// Whether some kernel of the definition follows the registry of accelerated device types.
bool follows_device_types(const Definition& definition) {
  const auto& kernels = definition.spec.kernels;
  return std::any_of(kernels.begin(), kernels.end(),
                     [](const auto& kernel) { return !kernel.device_types; });
}

// Every current definition whose kernels follow the registry, rebuilt for `types` (keeping its
// serial: it is the same declaration). Under the registry's lock.
std::vector<std::pair<OpEntry*, DefinitionPtr>> rebuilt_for(Registry& reg,
                                                            const std::vector<std::string>& types,
                                                            bool skip_failures = false) {
  std::vector<std::pair<OpEntry*, DefinitionPtr>> rebuilt;
  const NamesInBuild names_in_build;
  for (auto& [qualified, entry] : reg.ops) {
    auto current = entry->load();
    if (!current || !follows_device_types(*current) || current->device_types == types) continue;
    try {
      rebuilt.emplace_back(entry, build(current->spec, types, current.get()));
    } catch (const std::exception&) {
      if (!skip_failures) throw;
    }
  }
  return rebuilt;
}

std::vector<std::string> accelerated_device_types() {
  auto& reg = registry();
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  return reg.device_types;
}

namespace {

std::string register_device_type_now(const std::string& raw_name) {
  std::string normalized = normalize_device_type(raw_name);
  const std::string name = detail::escaped(raw_name);  // for messages: a NUL ended Python's
  TORCH_CHECK_VALUE(!normalized.empty(),
                    "opreg: register_accelerated_device_type: the device type name is empty");
  const size_t colon = normalized.find(':');
  TORCH_CHECK_VALUE(colon == std::string::npos, "opreg: register_accelerated_device_type: '", name,
                    "' is a device; name its type ('", detail::escaped(normalized.substr(0, colon)),
                    "'): a kernel serves every device of its type");
  TORCH_CHECK_VALUE(is_identifier(normalized), "opreg: register_accelerated_device_type: '", name,
                    "' is not a device type name like 'cuda' or 'npu'");
  TORCH_CHECK_VALUE(normalized != "cpu" && normalized != "meta",
                    "opreg: register_accelerated_device_type: '", name,
                    "' is no accelerator: kernels that follow the accelerated device types are "
                    "written for accelerators (the fallback serves the CPU; the fake, meta "
                    "tensors); name a kernel's device types to have it serve '",
                    normalized, "'");
  auto& reg = registry();
  Garbage garbage;  // destroyed after the lock is released
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  const bool nested = defining;  // a kernel factory that defines runs nested
  defining = true;
  const auto not_defining = c10::make_scope_exit([nested] { defining = nested; });
  if (std::find(reg.device_types.begin(), reg.device_types.end(), normalized) !=
      reg.device_types.end()) {
    auto requests = reg.device_type_requests.find(normalized);
    if (requests != reg.device_type_requests.end()) {
      ++requests->second;
      detail::record_loaded_device_type(normalized);
    }
    return normalized;
  }
  // Sweep 47 B-F1/F4: a kernel factory that registered a type while an op was built freed the
  // device types the build read (heap-use-after-free), and one that registered a type while this
  // registration rebuilt the ops had it overwritten below.
  TORCH_CHECK(!nested, "opreg: register_accelerated_device_type('", normalized,
              "'): called while opreg builds an op (from a kernel factory, say), whose kernels "
              "would not see it; register device types before defining the ops that follow them");
  std::vector<std::string> types = reg.device_types;
  types.push_back(normalized);
  // Built first, published after, so an error leaves every op and the registry as they were.
  auto rebuilt = rebuilt_for(reg, types);
  for (auto& [entry, definition] : rebuilt) {
    auto previous = publish(*entry, definition, &garbage.definitions);
    detail::record_loaded_definition(entry->qualified, definition, std::move(previous),
                                     entry->last_change);
  }
  reg.device_types = std::move(types);
  reg.device_type_requests[normalized] = 1;
  detail::record_loaded_device_type(normalized);
  return normalized;
}

}  // namespace

std::string register_accelerated_device_type(const std::string& name) {
  if (!detail::loading_library()) return register_device_type_now(name);
  detail::record_load_caller(__builtin_return_address(0));
  // Inside a library's static initializer an exception aborts the process: as a definition's,
  // the error fails the load instead (which takes back what the library registered).
  try {
    return register_device_type_now(name);
  } catch (const std::exception& error) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    detail::record_load_failure(
        "accelerated device type '" + name + "'",
        c10_error ? c10_error->what_without_backtrace() : detail::what_of(error));
    return "";
  }
}

void detail::unregister_device_type(const std::string& name) {
  auto& reg = registry();
  Garbage garbage;  // destroyed after the lock is released
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  const bool nested = defining;
  defining = true;
  const auto not_defining = c10::make_scope_exit([nested] { defining = nested; });
  auto requests = reg.device_type_requests.find(name);
  TORCH_INTERNAL_ASSERT(requests != reg.device_type_requests.end() && requests->second > 0, name,
                        ": unregistering a device type not registered");
  if (--requests->second > 0) return;  // asked for by someone else too: it stays
  reg.device_type_requests.erase(requests);
  std::vector<std::string> types = reg.device_types;
  types.erase(std::remove(types.begin(), types.end(), name), types.end());
  // Removing a type only drops kernels, so a rebuild that fails (a kernel factory that throws
  // now) keeps that op as it is rather than leave the registry half changed.
  for (auto& [entry, definition] : rebuilt_for(reg, types, /*skip_failures=*/true)) {
    publish(*entry, definition, &garbage.definitions);
  }
  reg.device_types = std::move(types);
}

constexpr const char* kLookupInLoad =
    " (a lookup in a library's static initializer fails the load instead of throwing; "
    "opreg::is_defined asks without failing it)";

c10::OperatorHandle find_operator(const std::string& qualified) {
  auto dot = qualified.find('.', qualified.find("::"));
  c10::OperatorName name{qualified.substr(0, dot),
                         dot == std::string::npos ? "" : qualified.substr(dot + 1)};
  auto& dispatcher = c10::Dispatcher::singleton();
  if (auto handle = dispatcher.findSchema(name)) return *handle;
  {
    // A replace that changes an opreg op's schema leaves the dispatcher without one for a moment
    // (sweep 33 B-F2: calls racing it were told the op was not defined). It holds the registry's
    // lock meanwhile: once the lock is had, the new schema is there.
    auto& reg = registry();
    std::lock_guard<std::recursive_mutex> lock(reg.mutex);
    auto found = reg.ops.find(qualified);
    if (found != reg.ops.end() && found->second->load() != nullptr) {
      if (auto handle = dispatcher.findSchema(name)) return *handle;
    }
  }
  const std::string message =
      "opreg: no op named '" + qualified + "' is defined" + default_overload_hint(qualified);
  TORCH_CHECK_VALUE(detail::loading_library(), message);
  // In a library's static initializer an exception would terminate the process: the load fails
  // instead, and the lookup returns the handle of the bare name (with no schema, its calls fail;
  // it serves the op if one of this name is defined later), kept for the life of the process.
  detail::record_load_caller(__builtin_return_address(0));
  detail::record_load_failure(qualified, message + kLookupInLoad);
  static auto* mutex = new std::mutex();
  static auto* names = new std::vector<c10::RegistrationHandleRAII>();
  std::lock_guard<std::mutex> lock(*mutex);
  names->push_back(dispatcher.registerName(name));
  return *dispatcher.findOp(name);
}

namespace {

// A handle's argument of one C++ enum where the schema declares another (at::Layout for
// ScalarType): both pass as an int, so c10::findSchemaDifferences sees none, and the op read
// Layout::Sparse as ScalarType::Char (sweep 54 B-N7).
std::optional<std::string> enum_passed_as_another(const std::vector<c10::Argument>& cpp,
                                                  const std::vector<c10::Argument>& declared) {
  const auto kind_of = [](const std::string& type) -> std::string {
    for (const char* kind : {"ScalarType", "Layout", "MemoryFormat"}) {
      if (type.find(kind) != std::string::npos) return kind;
    }
    return "";
  };
  for (size_t i = 0; i < cpp.size() && i < declared.size(); ++i) {
    const std::string cpp_type = cpp[i].real_type()->str();
    const std::string schema_type = declared[i].real_type()->str();
    const std::string cpp_kind = kind_of(cpp_type);
    const std::string schema_kind = kind_of(schema_type);
    if (cpp_kind.empty() || schema_kind.empty() || cpp_kind == schema_kind) continue;
    const std::string name =
        declared[i].name().empty() ? std::to_string(i) : "'" + declared[i].name() + "'";
    return "argument " + name + " is " + cpp_type + " in the handle's C++ signature but " +
           schema_type + " in the schema, which would read its value as another enum's; pass " +
           schema_type;
  }
  return std::nullopt;
}

// How the schema's results differ from the arguments PyTorch's typed call returns for a
// handle's Tensor reference results (check_handle_signature's `reference_results`).
std::optional<std::string> reference_result_difference(const c10::FunctionSchema& schema,
                                                       uint64_t reference_results) {
  const auto& arguments = schema.arguments();
  const auto& returns = schema.returns();
  const bool first = (reference_results & detail::kReturnsFirstArgument) != 0;
  for (size_t i = 0; i < returns.size() && i < 63; ++i) {
    if ((reference_results >> i & 1) == 0) continue;
    const size_t picked = first ? 0 : arguments.size() + i - returns.size();
    std::ostringstream said;
    said << "result " << i << " is a Tensor reference in the handle's C++ signature, which "
         << "PyTorch's typed call returns as its ";
    if (picked >= arguments.size()) {
      said << "argument " << picked << ", but the schema has " << arguments.size();
      return said.str();
    }
    said << "argument " << picked << " ('" << arguments[picked].name() << "')";
    const auto* alias = returns[i].alias_info();
    const auto* argument_alias = arguments[picked].alias_info();
    if (alias == nullptr) {
      said << ", but the schema returns a new tensor there; type it at::Tensor";
    } else if (!alias->isWrite()) {
      said << ", but the schema returns a view there, not an argument written in place; type it "
              "at::Tensor";
    } else if (argument_alias == nullptr || argument_alias->beforeSets() != alias->beforeSets()) {
      said << ", but the schema's result " << i << " is another argument written in place; type "
           << "it at::Tensor, or order the handle's parameters as PyTorch reads them (an in-place "
              "argument first, or the written arguments last, in the results' order)";
    } else if (std::any_of(arguments.begin(), arguments.end(), [&](const c10::Argument& other) {
                 return &other != &arguments[picked] && other.alias_info() != nullptr &&
                        other.alias_info()->beforeSets() == alias->beforeSets();
               })) {
      // Sweep 54 B-N2: `(Tensor(a!) x, Tensor(a!) y) -> Tensor(a!)` returned y, the handle x.
      said << ", but the schema gives its alias set to another argument too, so it does not say "
              "which of them the op returns; type it at::Tensor";
    } else {
      continue;
    }
    return said.str();
  }
  return std::nullopt;
}

}  // namespace

void check_handle_signature(const c10::OperatorHandle& handle,
                            const c10::FunctionSchema& handle_signature) {
  check_handle_signature(handle, handle_signature, 0);
}

void check_handle_signature(const c10::OperatorHandle& handle,
                            const c10::FunctionSchema& handle_signature,
                            uint64_t reference_results) {
  // A lookup inside a library's load gives a handle without a schema for a missing op.
  // Inside the load, the lookup's failure is recorded with the same message (listed once).
  // An opreg op's schema is copied under the registry's lock: a replace on another thread frees
  // the dispatcher's copy, which handle.schema() refers to, and leaves the dispatcher without
  // one for a moment (sweep 33 B-F2: a call racing it was told the op was not defined).
  std::optional<c10::FunctionSchema> registered;
  {
    auto& reg = registry();
    std::lock_guard<std::recursive_mutex> lock(reg.mutex);
    const auto& name = handle.operator_name();
    auto found =
        reg.ops.find(name.overload_name.empty() ? name.name : name.name + "." + name.overload_name);
    if (found != reg.ops.end()) {
      // Not registered now (undefined, or a rollback in progress): the call says what is wrong.
      if (!found->second->registered) return;
      registered = found->second->registered->schema;
    }
  }
  TORCH_CHECK_VALUE(registered || handle.hasSchema(), "opreg: no op named '",
                    handle.operator_name(), "' is defined",
                    detail::loading_library() ? kLookupInLoad : "");
  const c10::FunctionSchema schema = registered ? *registered : handle.schema();
  // A handle reads the op's results: one typed as a C++ enum where the schema returns `int` took
  // any int unchecked (sweep 51 B-N1: an OpHandle<at::ScalarType(...)> returned ScalarType -96).
  auto difference = c10::findSchemaDifferences(handle_signature, schema);
  if (!difference) {
    difference = detail::int_read_as_enum(handle_signature.returns(), schema.returns(), "result",
                                          "the handle's C++ signature");
  }
  if (!difference) {
    difference = enum_passed_as_another(handle_signature.arguments(), schema.arguments());
  }
  // PyTorch's typed call returns a Tensor reference result as one of its arguments, never reading
  // the op's result: the first argument for an in-place signature, else the last ones in order.
  // One the schema returns as a new tensor (sweep 52 B-N43), or as another argument (sweep 53
  // B-N1: `(Tensor(a!) x, Tensor(b!) y) -> Tensor(b!)` returned x), was another tensor.
  if (!difference) {
    difference = reference_result_difference(schema, reference_results);
  }
  if (difference) {
    std::ostringstream signature_text, schema_text;
    signature_text << handle_signature;
    schema_text << schema;
    TORCH_CHECK_VALUE(false, "opreg: op '", qualified_name_of(schema),
                      "': the handle's C++ signature does not match the schema: ", *difference,
                      " (the handle's signature reads as '", signature_text.str(),
                      "', the schema is '", schema_text.str(), "')");
  }
}

namespace detail {

namespace {
// Set once, when opreg's Python module is imported; read by any thread after.
std::atomic<bool (*)(const std::exception&) noexcept> python_error_test{nullptr};
std::atomic<std::string (*)(const std::exception&)> python_error_message{nullptr};
}  // namespace

void set_python_error_reader(PythonErrorReader reader) {
  python_error_message.store(reader.message_of);
  python_error_test.store(reader.is_python_error);
}

bool is_python_error(const std::exception& error) noexcept {
  const auto test = python_error_test.load();
  return test != nullptr && test(error);
}

std::string message_of(const std::exception& error) {
  if (is_python_error(error)) return python_error_message.load()(error);
  // c10's what() ends in C++ frames of opreg's (sweep 52 B-N34: OPREG_DEBUG's fake check).
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return what_of(c10_error->what_without_backtrace());
  }
  return what_of(error);
}

bool value_fits(const c10::IValue& value, const c10::Type& type) { return fits(value, type); }

std::vector<size_t> alias_arguments_of(const c10::FunctionSchema& schema,
                                       const c10::Argument& ret) {
  const auto returned = alias_sets_of(ret.alias_info());
  if (!returned || returned->empty()) return {};
  std::vector<size_t> arguments;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto sets = alias_sets_of(schema.arguments()[i].alias_info());
    if (!sets) return {};  // a wildcard argument may hold anything
    if (std::any_of(sets->begin(), sets->end(),
                    [&](const c10::Symbol& set) { return returned->count(set) != 0; })) {
      arguments.push_back(i);
    }
  }
  return arguments;
}

bool share_memory(const at::Tensor& a, const at::Tensor& b) {
  return Memory(a).shared_with(Memory(b), a.device() == b.device());
}

void throw_no_fake(const std::string& op, const std::string& reason) {
  // The reason may carry a C++ backtrace of an error rethrown inside it (a library's path among
  // its frames, in bytes that need not be UTF-8, which Python would then fail to read).
  const std::string said = reason.substr(0, reason.find("Exception raised from "));
  // PyTorch makes no nested tensor on meta (nor under FakeTensorMode): no fake can help, and its
  // refusal is an internal assert that asks for a bug report.
  TORCH_CHECK_NOT_IMPLEMENTED(
      said.find("NestedTensorImpl storage must be") == std::string::npos, op,
      ": its fallback makes a nested tensor, which PyTorch cannot make on meta tensors or under "
      "FakeTensorMode, so no fake can stand for it: meta calls and torch.export fail on this op, "
      "and torch.compile runs it outside its graph (a graph break); eager calls are not affected");
  TORCH_CHECK_NOT_IMPLEMENTED(false, op,
                              ": has no fake, and its fallback failed on meta tensors; give the op "
                              "a fake (.fake(fn) in C++, fake_fn= in Python). The fallback said: ",
                              valid_utf8(said));
}

void call_checked_fallback(const std::string& op, const c10::OperatorHandle& handle,
                           torch::jit::Stack* stack) {
  // Held for the call, as a dispatched call holds its definition: a replace racing it frees the
  // definition it replaces, which the fallback's kernel reads.
  const auto definition = current_definition(op);
  check_arguments(*definition, *stack);  // the caller's values (sweep 50 B-C3: said as a kernel's)
  definition->checked_fallback->callBoxed(
      handle, c10::DispatchKeySet(c10::DispatchKey::CompositeExplicitAutograd), stack);
}

std::shared_ptr<const c10::FunctionSchema> current_schema(const std::string& op) {
  auto definition = current_definition(op);
  return {definition, &definition->schema()};
}

// PyTorch reads a boxed call's dispatch arguments back from the stack's end by the schema it
// holds at that moment: after a replace that added an argument, it read before the start of a
// stack made for the earlier schema (sweep 33 B-F4, AddressSanitizer). It reads at most 64
// values back (its bitset of dispatch arguments has 64 bits), so with 64 Nones before the
// arguments every read stays inside; the trampoline counts the arguments without them.
void call_boxed_padded(const c10::OperatorHandle& handle, torch::jit::Stack* stack) {
  constexpr size_t kPadding = 64;
  stack->insert(stack->begin(), kPadding, c10::IValue());
  const auto* outer_stack = padded_stack;
  const size_t outer_padding = stack_padding;
  padded_stack = stack;
  stack_padding = kPadding;
  const auto restore = c10::make_scope_exit([&] {
    padded_stack = outer_stack;
    stack_padding = outer_padding;
    stack->erase(stack->begin(), stack->begin() + std::min(kPadding, stack->size()));
  });
  handle.callBoxed(stack);
}

void check_stack(const std::string& op, const torch::jit::Stack& stack) {
  check_arguments(*current_definition(op), stack);
}

void check_stack_dtypes(const std::string& op, const torch::jit::Stack& stack) {
  const auto definition = current_definition(op);
  if (!definition->dtype_rules.empty()) check_dtypes(*definition, stack);
}

bool same_declaration(const std::shared_ptr<const void>& a, const std::shared_ptr<const void>& b) {
  if (!a || !b) return !a && !b;
  return static_cast<const Definition*>(a.get())->serial ==
         static_cast<const Definition*>(b.get())->serial;
}

std::string origin_of_definition(const std::shared_ptr<const void>& definition) {
  return static_cast<const Definition*>(definition.get())->origin;
}

bool restore_definition(const std::string& qualified, const std::shared_ptr<const void>& published,
                        std::shared_ptr<const void> previous, ChangeCount changes) {
  auto& reg = registry();
  Garbage garbage;  // destroyed after the lock is released
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  auto found = reg.ops.find(qualified);
  TORCH_INTERNAL_ASSERT(found != reg.ops.end(), qualified, ": restoring an op never defined");
  // By serial: a device type registered meanwhile rebuilt the definition, which is still the
  // load's.
  const DefinitionPtr current = found->second->load();
  const auto* load_made = static_cast<const Definition*>(published.get());
  if ((current == nullptr) != (load_made == nullptr)) return false;
  if (current != nullptr && current->serial != load_made->serial) return false;
  // Undefined by the load, then defined and undefined again by another thread: null both times.
  if (found->second->changes != changes.after) return false;
  auto restored = std::static_pointer_cast<const Definition>(previous);
  // Built before a device type was registered (or after one was taken back): it serves the
  // types registered now, as every other op does.
  if (restored && follows_device_types(*restored) && restored->device_types != reg.device_types) {
    try {
      const std::vector<std::string> device_types = reg.device_types;  // kept while it builds
      const NamesInBuild names_in_build;
      restored = build(restored->spec, device_types, restored.get());
    } catch (const std::exception&) {
      // A kernel factory that fails now: the earlier definition as it was beats none.
    }
  }
  publish(*found->second, restored, &garbage.definitions);
  found->second->changes = changes.before;  // as if the load had not published: see OpEntry
  return true;
}

// Note [A schema change and Python's callers]
// PyTorch's Python argument parser reads an op's registered schema by reference, under the GIL;
// a replace that registers the schema anew (another text, fake module or tags: the same text too)
// deregisters the old one, which frees it. From a thread
// without the GIL (C++), such a replace freed the schema under a parser reading it (seen:
// segfaults, hangs, heap-use-after-free). So a definition that changes a registered schema holds
// the lock that opreg's Python module sets, taken before the registry's lock (Python threads
// hold the GIL when they take the registry's lock): the GIL, held for it by a thread of its own,
// for at most a second of waiting. The defining thread never waits for the GIL itself: it may
// hold the dynamic loader's lock (a library's static initializer, or a thread one waits for),
// which a Python thread holding the GIL may wait for (an import, ctypes.CDLL); if the GIL does
// not come in time, the schema changes without it, as before. Not taken: on a thread that
// opreg::load_library loads a library on; and in a definition made from inside another (the
// registry's lock is held already), which is refused instead where the lock would be needed.
std::mutex schema_change_lock_mutex;
SchemaChangeLock schema_change_lock;
bool changes_a_registered_schema(Registry& reg, const std::vector<DefinitionPtr>& definitions) {
  return std::any_of(definitions.begin(), definitions.end(), [&](const DefinitionPtr& definition) {
    auto found = reg.ops.find(definition->name());
    if (found == reg.ops.end()) return false;
    const auto& registered = found->second->registered;
    return registered && reregisters_schema(*registered, *definition);
  });
}

std::shared_ptr<void> take_schema_change_lock() {
  SchemaChangeLock lock;
  {
    std::lock_guard<std::mutex> guard(schema_change_lock_mutex);
    lock = schema_change_lock;
  }
  return lock ? lock() : nullptr;
}

void set_schema_change_lock(SchemaChangeLock lock) {
  std::lock_guard<std::mutex> guard(schema_change_lock_mutex);
  schema_change_lock = std::move(lock);
}

std::function<bool()> schema_change_lock_needed_here;  // guarded by schema_change_lock_mutex

void set_schema_change_lock_needed(std::function<bool()> needed) {
  std::lock_guard<std::mutex> guard(schema_change_lock_mutex);
  schema_change_lock_needed_here = std::move(needed);
}

bool schema_change_lock_needed() {
  std::function<bool()> needed;
  {
    std::lock_guard<std::mutex> guard(schema_change_lock_mutex);
    needed = schema_change_lock_needed_here;
  }
  return needed && needed();
}

std::function<void()> replace_listener;  // guarded by schema_change_lock_mutex

void set_replace_listener(std::function<void()> listener) {
  std::lock_guard<std::mutex> guard(schema_change_lock_mutex);
  replace_listener = std::move(listener);
}

void tell_replace_listener() {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> guard(schema_change_lock_mutex);
    listener = replace_listener;
  }
  if (listener) listener();
}

}  // namespace detail

namespace {

// Whether this thread is inside define_all_recording_failures (below).
thread_local bool recording_load_failures = false;

std::vector<std::string> define_all_recording_failures(std::vector<OpBuilder> builders, AbiTag abi);

}  // namespace

std::vector<std::string> define_all(std::vector<OpBuilder> builders, AbiTag abi) {
  if (detail::loading_library() && !recording_load_failures) {
    return define_all_recording_failures(std::move(builders), abi);
  }
  std::vector<std::string> names;
  for (auto& published : detail::define_all_published(std::move(builders), abi)) {
    names.push_back(std::move(published.name));
  }
  return names;
}

std::vector<detail::Published> detail::define_all_published(std::vector<OpBuilder> builders,
                                                            AbiTag abi) {
  const AbiTag here;
  const std::string op = builders.empty() ? std::string("an op") : builders[0].declared_name();
  TORCH_CHECK(abi.major == here.major && abi.minor == here.minor, "opreg: ", op,
              ": its library was built against opreg ", abi.major, ".", abi.minor, ".", abi.patch,
              " headers, but the loaded libopreg is opreg ", OPREG_VERSION_STRING,
              "; rebuild the library against this opreg");
  // Same version, other layout: another compiler or standard library (sweep 51 B-N14: this was
  // said as the version message above, naming one version twice).
  TORCH_CHECK(
      abi.factory_size == here.factory_size && abi.context_size == here.context_size, "opreg: ", op,
      ": its library was built against opreg ", OPREG_VERSION_STRING,
      " headers with another compiler or C++ standard library: opreg's KernelFactory is ",
      abi.factory_size, " bytes there and ", here.factory_size, " here, its KernelContext ",
      abi.context_size, " and ", here.context_size,
      "; rebuild the library with the compiler and standard library PyTorch was built with");
  for (auto& builder : builders) {
    if (builder.state_ != nullptr && builder.state_->origin.empty()) {
      builder.state_->origin = origin_of(builder.state_->caller);
    }
  }
  auto& reg = registry();
  Garbage garbage;                           // destroyed after the locks are released
  std::shared_ptr<void> schema_change_lock;  // released after the registry's lock
  // Built definitions that a failure drops: destroyed after the lock too, as what their pieces
  // hold may call opreg from another thread (sweep 47 B-F3: a destructor joining one hung).
  std::vector<DefinitionPtr> definitions;
  std::unique_lock<std::recursive_mutex> lock(reg.mutex);
  const bool nested = defining;
  defining = true;
  std::vector<const void*> libraries_to_pin;
  if (!nested) t_libraries_to_pin = &libraries_to_pin;
  const auto not_defining = c10::make_scope_exit([nested] {
    defining = nested;
    if (!nested) t_libraries_to_pin = nullptr;
  });
  // 1. Build and validate every definition; nothing is published yet.
  const std::vector<std::string> device_types = reg.device_types;  // kept while factories run
  std::map<std::string, Definition*> built;
  // Told before any is built: the second of a name would otherwise be said to come from a kernel
  // factory (NamesInBuild; sweep 52 B-N11).
  std::set<std::string> declared;
  for (const auto& builder : builders) {
    std::string name = builder.declared_name();
    name.erase(name.find_last_not_of(" \t\n") + 1);
    TORCH_CHECK_VALUE(name.empty() || declared.insert(name).second, name,
                      ": defined twice in one definition");
  }
  std::optional<NamesInBuild> names_in_build(std::in_place);
  for (auto& builder : builders) {
    TORCH_CHECK_VALUE(builder.state_ != nullptr,
                      "opreg: this OpBuilder was already defined (or moved from); make a new one");
    auto definition = build(std::move(*builder.state_), device_types);
    builder.state_.reset();
    check_publishable(reg, *definition);
    TORCH_CHECK_VALUE(built.emplace(definition->name(), definition.get()).second,
                      definition->name(), ": defined twice in one definition");
    definitions.push_back(std::move(definition));
  }
  names_in_build.reset();
  // A part of its own part could be undefined by neither: refuse a part_of chain that comes back.
  // Each chain is walked until it ends or meets one known to end (sweep 50 B-P3: walking every
  // op's whole chain, a chain of 4000 parts took 29 s under the registry's lock).
  std::set<std::string> ends;
  for (const auto& [name, definition] : built) {
    std::vector<std::string> chain{name};
    std::set<std::string> in_chain{name};
    for (auto owner = definition->spec.part_of; owner && ends.count(*owner) == 0;) {
      const bool cycle = !in_chain.insert(*owner).second;
      chain.push_back(*owner);
      TORCH_CHECK_VALUE(!cycle, name, ": part_of('", *definition->spec.part_of,
                        "') makes a cycle (", c10::Join(" is part of ", chain),
                        "): an op cannot be part of one of its own parts");
      if (auto together = built.find(*owner); together != built.end()) {
        owner = together->second->spec.part_of;
      } else if (auto found = reg.ops.find(*owner); found != reg.ops.end()) {
        const auto current = found->second->load();
        owner = current ? current->spec.part_of : std::nullopt;
      } else {
        owner = std::nullopt;
      }
    }
    ends.insert(chain.begin(), chain.end());
  }
  for (auto& [name, definition] : built) {
    if (!definition->spec.part_of) continue;
    const auto& owner = *definition->spec.part_of;
    if (auto together = built.find(owner); together != built.end()) {
      definition->owner_serial = together->second->serial;
    } else if (auto found = reg.ops.find(owner); found != reg.ops.end()) {
      if (auto current = found->second->load()) definition->owner_serial = current->serial;
    }
  }
  check_parts_stay_with_their_owners(reg, built);
  // See Note [A schema change and Python's callers].
  if (!nested && !detail::loading_library() &&
      detail::changes_a_registered_schema(reg, definitions)) {
    lock.unlock();
    schema_change_lock = detail::take_schema_change_lock();
    lock.lock();
    TORCH_CHECK(reg.device_types == device_types, "opreg: ", definitions.front()->name(),
                ": a device type was registered while this definition waited to change the "
                "op's schema; nothing was defined: define it again");
    for (const auto& definition : definitions) check_publishable(reg, *definition);
    check_parts_stay_with_their_owners(reg, built);
  } else if (nested && !detail::loading_library() &&
             detail::changes_a_registered_schema(reg, definitions) &&
             detail::schema_change_lock_needed()) {
    // The definition around this one holds the registry's lock, which Python's threads take
    // holding the GIL: this one cannot wait for the GIL (sweep 40 B-F1: a kernel factory's
    // replace freed a schema under Python's callers).
    TORCH_CHECK(false, "opreg: ", definitions.front()->name(),
                ": a definition made inside another (by a kernel factory) would register an op's "
                "schema anew on a thread without the GIL, under Python's callers reading it; "
                "nothing was defined: make this definition outside the other, or holding the GIL");
  }
  // 2. Publish them all, or, if one fails, put back what was published before it.
  std::vector<std::pair<OpEntry*, DefinitionPtr>> published;
  std::vector<detail::ChangeCount> changes;
  bool defined_again = false;
  try {
    for (const auto& definition : definitions) {
      OpEntry& entry = entry_for(reg, *definition);
      // An op defined again after an undefine is a replace to compiled code, which still calls
      // the earlier definition's kernels with the buffers its fake gave (sweep 51 A-F1: wrong
      // values, a double free).
      defined_again = defined_again || entry.changes > 0;
      published.emplace_back(&entry, publish(entry, definition, &garbage.definitions));
      changes.push_back(entry.last_change);
    }
  } catch (...) {
    for (auto it = published.rbegin(); it != published.rend(); ++it)
      publish(*it->first, it->second, &garbage.definitions);
    throw;
  }
  std::vector<Published> published_ops;
  bool replaced = defined_again;
  for (size_t i = 0; i < definitions.size(); ++i) {
    replaced = replaced || published[i].second != nullptr;
    if (t_libraries_to_pin != nullptr) {
      t_libraries_to_pin->push_back(definitions[i]->spec.caller);
    } else {  // nested in a device type's registration (a kernel factory that defines ops)
      pin_library_of(definitions[i]->spec.caller);
    }
    detail::record_loaded_definition(published[i].first->qualified, definitions[i],
                                     published[i].second, changes[i]);
    published_ops.push_back({definitions[i]->name(), definitions[i]->serial});
  }
  if (!nested) {
    lock.unlock();
    t_libraries_to_pin = nullptr;
    for (const void* caller : libraries_to_pin) pin_library_of(caller);
  }
  if (replaced) {
    if (lock.owns_lock()) lock.unlock();
    detail::tell_replace_listener();
  }
  return published_ops;
}

namespace {

// While opreg::load_library runs a library's static initializers, an exception must not leave
// define() or define_all(): it would terminate the process. The error is recorded and raised by
// load_library, naming the ops declared together.
std::vector<std::string> define_all_recording_failures(std::vector<OpBuilder> builders,
                                                       AbiTag abi) {
  recording_load_failures = true;
  const auto leave = c10::make_scope_exit([] { recording_load_failures = false; });
  std::vector<std::string> declared;
  std::string names;
  for (const auto& builder : builders) {
    declared.push_back(builder.declared_name());
    names += (names.empty() ? "" : ", ") +
             (declared.back().empty() ? "(an OpBuilder defined already)" : declared.back());
  }
  try {
    return define_all(std::move(builders), abi);
  } catch (const c10::Error& error) {
    detail::record_load_failure(names, error.what_without_backtrace());
  } catch (const std::exception& error) {
    detail::record_load_failure(names, detail::what_of(error));
#if defined(__GLIBCXX__)
  } catch (const abi::__forced_unwind&) {
    throw;  // a cancelled thread's unwinding must go on
#endif
  } catch (...) {
    detail::record_load_failure(
        names, "a piece of its declaration threw something that is not a std::exception");
  }
  return declared;
}

}  // namespace

std::string OpBuilder::define(AbiTag abi) && {
  std::vector<OpBuilder> builders;
  builders.push_back(std::move(*this));
  return define_all(std::move(builders), abi).front();
}

std::vector<OpReport> describe_ops() {
  auto& reg = registry();
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  std::vector<OpReport> reports;
  for (const auto& [name, entry] : reg.ops) {
    if (auto definition = entry->load()) reports.push_back(report_of(*definition));
  }
  return reports;
}

OpReport describe_op(const std::string& name) {
  if (!detail::loading_library()) return report_of(*current_definition(name));
  // As find_operator: in a static initializer the load fails instead of the process, and the
  // report names the op and nothing else.
  detail::record_load_caller(__builtin_return_address(0));
  try {
    return report_of(*current_definition(name));
  } catch (const c10::Error& error) {
    detail::record_load_failure(name, error.what_without_backtrace() + std::string(kLookupInLoad));
  }
  OpReport nothing;
  nothing.name = name;
  return nothing;
}

bool is_defined(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  auto found = reg.ops.find(name);
  return found != reg.ops.end() && found->second->load() != nullptr;
}

const std::atomic<uint64_t>* detail::schema_changes_of(const std::string& qualified) {
  auto& reg = registry();
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  auto found = reg.ops.find(qualified);
  return found == reg.ops.end() ? nullptr : &found->second->schema_generation;
}

bool detail::dropping_definitions() { return t_dropping_definitions > 0; }

bool detail::inside_definition() { return defining; }

uint64_t detail::definition_serial(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  auto found = reg.ops.find(name);
  auto definition = found == reg.ops.end() ? nullptr : found->second->load();
  return definition ? definition->serial : 0;
}

bool detail::defined_before(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  auto found = reg.ops.find(name);
  return found != reg.ops.end() && found->second->changes > 0;
}

namespace {

void undefine_now(const std::string& name) {
  auto& reg = registry();
  Garbage garbage;  // destroyed after the lock is released
  std::lock_guard<std::recursive_mutex> lock(reg.mutex);
  if (t_names_in_build != nullptr) {  // see NamesInBuild (sweep 50 B-F1: the op was lost)
    const auto& building = *t_names_in_build;
    TORCH_CHECK_VALUE(std::find(building.begin(), building.end(), name) == building.end(),
                      "opreg: cannot undefine '", name,
                      "' while a definition of it is being built "
                      "(by one of the kernel factories that build runs); undefine it outside the "
                      "factories");
  }
  auto found = reg.ops.find(name);
  TORCH_CHECK_VALUE(found != reg.ops.end() && found->second->load() != nullptr,
                    "opreg: cannot undefine '", name, "': no op of this name is defined by opreg",
                    default_overload_hint(name));
  const auto part = found->second->load();
  if (const auto& owner = part->spec.part_of) {
    auto owner_entry = reg.ops.find(*owner);
    auto owner_now = owner_entry == reg.ops.end() ? nullptr : owner_entry->second->load();
    TORCH_CHECK_VALUE(owner_now == nullptr || owner_now->serial != part->owner_serial,
                      "opreg: cannot undefine '", name, "' on its own: it is part of '", *owner,
                      "' (such as its vmap_fn companion), which calls it and is undefined with it;"
                      " undefine '",
                      *owner, "', or define '", *owner, "' again without it");
  }
  // Inside opreg::load_library, a failed load puts the definitions back with the others.
  auto previous = publish(*found->second, nullptr, &garbage.definitions);
  detail::record_loaded_definition(name, nullptr, std::move(previous), found->second->last_change);
  // Its parts, and the parts of parts, found in one pass over the ops: a pass for each owner was
  // quadratic under the lock (sweep 51 B-N23: 16000 parts took 28 s).
  std::unordered_map<std::string_view, std::vector<decltype(reg.ops)::value_type*>> parts_of;
  for (auto& op : reg.ops) {
    auto definition = op.second->load();
    if (definition != nullptr && definition->spec.part_of) {
      parts_of[*definition->spec.part_of].push_back(&op);
    }
  }
  std::vector<std::string_view> owners{name};
  while (!owners.empty()) {
    const auto parts = parts_of.find(owners.back());
    owners.pop_back();
    if (parts == parts_of.end()) continue;
    for (auto* part : parts->second) {
      auto previous_part = publish(*part->second, nullptr, &garbage.definitions);
      detail::record_loaded_definition(part->first, nullptr, std::move(previous_part),
                                       part->second->last_change);
      owners.push_back(part->first);
    }
  }
}

}  // namespace

void undefine(const std::string& name) {
  if (!detail::loading_library()) return undefine_now(name);
  detail::record_load_caller(__builtin_return_address(0));
  // As define(): an exception must not leave a library's static initializer.
  try {
    undefine_now(name);
  } catch (const c10::Error& error) {
    detail::record_load_failure(name, error.what_without_backtrace());
  } catch (const std::exception& error) {
    detail::record_load_failure(name, detail::what_of(error));
  }
}

}  // namespace opreg
