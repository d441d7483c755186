// src/triton/kernel.cpp: the registry of ahead-of-time compiled Triton kernels, and their launch:
// pick the variant that fits the arguments and the device, load its module on that device once,
// pack the parameters as Triton's launcher does, launch on PyTorch's current stream.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <nlohmann/json.hpp>

#include "cuda_driver.h"
#include "opreg/triton.h"

namespace opreg::triton {

constexpr size_t kMaxDevices = 64;
constexpr size_t kMaxParams = 64;
constexpr int64_t kDefaultMaxSharedMemory = 48 * 1024;

enum class ParamType : uint8_t {
  kPointer,
  kI1,
  kI8,
  kI16,
  kI32,
  kI64,
  kU32,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64
};
enum class AssumptionKind : uint8_t { kAligned16, kDiv16, kEquals1 };

struct Param {
  std::string name;
  std::string type_name;
  ParamType type;
  std::optional<at::ScalarType> pointee;  // the tensor dtype a pointer parameter reads
};

struct Assumption {
  size_t param;
  AssumptionKind kind;
};

struct Variant {
  int arch = 0;
  std::vector<Assumption> assumptions;
  std::string assumptions_text;
  std::string config_text;
  std::string entry;
  int num_warps = 4;
  int num_ctas = 1;
  int64_t shared = 0;
  int64_t global_scratch_size = 0, global_scratch_align = 1;
  int64_t profile_scratch_size = 0, profile_scratch_align = 1;
  bool launch_pdl = false;
  bool launch_cooperative_grid = false;
  std::vector<bool> dropped;  // per param: specialized to a constant, not passed
  std::string binary;
  std::mutex load_mutex;
  std::array<std::atomic<cuda::CUfunction>, kMaxDevices> functions{};
};

struct KernelImpl {
  std::string name;
  std::string source;
  std::vector<Param> params;
  std::vector<std::unique_ptr<Variant>> variants;
};

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<KernelImpl>> kernels;
};

Registry& registry() {
  static Registry* instance = new Registry();  // leaked: kernels outlive every static user
  return *instance;
}

// The tensor dtype a pointer parameter reads ("*fp32" -> Float), when the kernel says.
std::optional<at::ScalarType> pointee_dtype(const std::string& type) {
  static const std::unordered_map<std::string, at::ScalarType> types = {
      {"*fp16", at::kHalf}, {"*bf16", at::kBFloat16}, {"*fp32", at::kFloat}, {"*fp64", at::kDouble},
      {"*i8", at::kChar},   {"*u8", at::kByte},       {"*i16", at::kShort},  {"*i32", at::kInt},
      {"*i64", at::kLong},  {"*i1", at::kBool}};
  auto found = types.find(type);
  if (found == types.end()) return std::nullopt;
  return found->second;
}

ParamType parse_type(const std::string& kernel, const std::string& type) {
  if (!type.empty() && type[0] == '*') return ParamType::kPointer;
  static const std::unordered_map<std::string, ParamType> types = {
      {"i1", ParamType::kI1},    {"i8", ParamType::kI8},    {"i16", ParamType::kI16},
      {"i32", ParamType::kI32},  {"i64", ParamType::kI64},  {"u32", ParamType::kU32},
      {"u64", ParamType::kU64},  {"fp16", ParamType::kF16}, {"bf16", ParamType::kBF16},
      {"fp32", ParamType::kF32}, {"fp64", ParamType::kF64}};
  auto found = types.find(type);
  TORCH_CHECK_VALUE(found != types.end(), "opreg: Triton kernel '", kernel,
                    "': unsupported parameter type '", type, "'");
  return found->second;
}

AssumptionKind parse_assumption(const std::string& kernel, const std::string& kind) {
  if (kind == "aligned16") return AssumptionKind::kAligned16;
  if (kind == "div16") return AssumptionKind::kDiv16;
  if (kind == "equals1") return AssumptionKind::kEquals1;
  TORCH_CHECK_VALUE(false, "opreg: Triton kernel '", kernel, "': unknown assumption '", kind, "'");
}

int param_size(ParamType type) {
  switch (type) {
    case ParamType::kI1:
    case ParamType::kI8:
      return 1;
    case ParamType::kI16:
    case ParamType::kF16:
    case ParamType::kBF16:
      return 2;
    case ParamType::kI32:
    case ParamType::kU32:
    case ParamType::kF32:
      return 4;
    default:
      return 8;
  }
}

// The launcher packs every parameter not specialized away, then the two scratch pointers; the
// binary's entry (its PTX, read by the compiler) must expect exactly that.
void check_layout(const KernelImpl& kernel, const Variant& variant, const std::vector<int>& ptx) {
  std::vector<int> packed;
  for (size_t i = 0; i < kernel.params.size(); ++i) {
    if (!variant.dropped[i]) packed.push_back(param_size(kernel.params[i].type));
  }
  packed.push_back(8);
  packed.push_back(8);
  TORCH_CHECK_VALUE(
      packed == ptx, "opreg: Triton kernel '", kernel.name, "' (sm_", variant.arch, ", ",
      variant.assumptions_text, "): the binary expects ", ptx.size(), " parameters of sizes ",
      c10::IntArrayRef(std::vector<int64_t>(ptx.begin(), ptx.end())), ", the launcher would pack ",
      c10::IntArrayRef(std::vector<int64_t>(packed.begin(), packed.end())),
      "; rebuild it with this opreg's python -m opreg.aot");
}

// Parses a manifest; `read_file(name)` gives the bytes of a binary it names.
template <class ReadFile>
std::unique_ptr<KernelImpl> parse_manifest(const std::string& text, ReadFile read_file) {
  auto manifest = nlohmann::json::parse(text);
  TORCH_CHECK_VALUE(manifest.value("format", "") == "opreg-triton-aot/1",
                    "opreg: not an opreg Triton manifest (format '", manifest.value("format", ""),
                    "'); rebuild it with python -m opreg.aot");
  auto kernel = std::make_unique<KernelImpl>();
  kernel->name = manifest.at("kernel").get<std::string>();
  kernel->source = manifest.value("source", "");
  for (const auto& param : manifest.at("params")) {
    auto type = param.at("type").get<std::string>();
    kernel->params.push_back({param.at("name").get<std::string>(), type,
                              parse_type(kernel->name, type), pointee_dtype(type)});
  }
  TORCH_CHECK_VALUE(kernel->params.size() <= kMaxParams, "opreg: Triton kernel '", kernel->name,
                    "' has more than ", kMaxParams, " parameters");
  for (const auto& raw : manifest.at("variants")) {
    auto variant = std::make_unique<Variant>();
    variant->arch = raw.at("arch").get<int>();
    variant->entry = raw.at("entry").get<std::string>();
    variant->num_warps = raw.at("num_warps").get<int>();
    variant->num_ctas = raw.at("num_ctas").get<int>();
    variant->shared = raw.at("shared").get<int64_t>();
    variant->global_scratch_size = raw.at("global_scratch_size").get<int64_t>();
    variant->global_scratch_align = raw.at("global_scratch_align").get<int64_t>();
    variant->profile_scratch_size = raw.at("profile_scratch_size").get<int64_t>();
    variant->profile_scratch_align = raw.at("profile_scratch_align").get<int64_t>();
    variant->launch_pdl = raw.at("launch_pdl").get<bool>();
    variant->launch_cooperative_grid = raw.at("launch_cooperative_grid").get<bool>();
    variant->dropped.assign(kernel->params.size(), false);
    std::ostringstream assumptions;
    for (const auto& a : raw.at("assumptions")) {
      Assumption assumption{a.at("param").get<size_t>(),
                            parse_assumption(kernel->name, a.at("kind").get<std::string>())};
      TORCH_CHECK_VALUE(assumption.param < kernel->params.size(), "opreg: Triton kernel '",
                        kernel->name, "': an assumption names parameter ", assumption.param);
      if (assumption.kind == AssumptionKind::kEquals1) variant->dropped[assumption.param] = true;
      assumptions << (variant->assumptions.empty() ? "" : ", ")
                  << kernel->params[assumption.param].name << ":"
                  << a.at("kind").get<std::string>();
      variant->assumptions.push_back(assumption);
    }
    variant->assumptions_text = variant->assumptions.empty() ? "generic" : assumptions.str();
    std::ostringstream config;
    const auto config_json = raw.value("config", nlohmann::json::object());
    for (const auto& [key, value] : config_json.items()) {
      config << (config.tellp() > 0 ? " " : "") << key << "=" << value;
    }
    variant->config_text = config.str();
    check_layout(*kernel, *variant, raw.at("param_sizes").get<std::vector<int>>());
    variant->binary = read_file(raw.at("file").get<std::string>());
    kernel->variants.push_back(std::move(variant));
  }
  return kernel;
}

void add_kernel(std::unique_ptr<KernelImpl> kernel) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto found = reg.kernels.find(kernel->name);
  if (found != reg.kernels.end()) {
    // The same bundle loaded twice (a library and a folder of the same build) is harmless; two
    // different kernels under one name are a mistake.
    TORCH_CHECK_VALUE(found->second->source == kernel->source &&
                          found->second->variants.size() == kernel->variants.size(),
                      "opreg: a Triton kernel named '", kernel->name,
                      "' is already registered from another source (", found->second->source, ")");
    return;
  }
  reg.kernels.emplace(kernel->name, std::move(kernel));
}

int compute_capability(int device) {
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  int known = cache[device].load(std::memory_order_relaxed);
  if (known != 0) return known;
  const auto* d = cuda::driver();
  cuda::CUdevice handle;
  int major = 0, minor = 0;
  TORCH_CHECK(d->cuDeviceGet(&handle, device) == cuda::kSuccess &&
                  d->cuDeviceGetAttribute(&major, cuda::kAttrComputeCapabilityMajor, handle) ==
                      cuda::kSuccess &&
                  d->cuDeviceGetAttribute(&minor, cuda::kAttrComputeCapabilityMinor, handle) ==
                      cuda::kSuccess,
              "opreg: cannot read the compute capability of CUDA device ", device);
  cache[device].store(major * 10 + minor, std::memory_order_relaxed);
  return major * 10 + minor;
}

// A cubin for sm_XY runs on devices of major X and minor >= Y; prefer the closest.
int best_arch(const KernelImpl& kernel, int capability) {
  int best = -1;
  for (const auto& variant : kernel.variants) {
    if (variant->arch / 10 == capability / 10 && variant->arch <= capability) {
      best = std::max(best, variant->arch);
    }
  }
  return best;
}

struct Call {
  const at::Tensor* first_tensor = nullptr;
  int device = -1;
};

Call inspect(const KernelImpl& kernel, c10::ArrayRef<Arg> args, std::string* why_not) {
  Call call;
  if (args.size() != kernel.params.size()) {
    *why_not = "it takes " + std::to_string(kernel.params.size()) + " arguments, " +
               std::to_string(args.size()) + " were given";
    return call;
  }
  size_t index = 0;
  for (const auto& arg : args) {
    const auto& param = kernel.params[index++];
    bool is_pointer_param = param.type == ParamType::kPointer;
    bool is_pointer_arg = arg.kind() == Arg::Kind::kTensor || arg.kind() == Arg::Kind::kPointer;
    if (is_pointer_param != is_pointer_arg) {
      *why_not = "argument '" + param.name + "' must be " +
                 (is_pointer_param ? "a tensor or pointer" : "a number (" + param.type_name + ")");
      return call;
    }
  }
  index = 0;
  for (const auto& arg : args) {
    const auto& param = kernel.params[index++];
    if (arg.kind() != Arg::Kind::kTensor) continue;
    const auto& tensor = arg.tensor();
    if (param.pointee && *param.pointee != tensor.scalar_type()) {
      *why_not = "argument '" + param.name + "' is " + c10::toString(tensor.scalar_type()) +
                 ", the kernel takes " + param.type_name;
      return call;
    }
    if (!tensor.is_cuda()) {
      *why_not = "argument '" + param.name + "' is on " + tensor.device().str() + ", not CUDA";
      return call;
    }
    if (call.first_tensor == nullptr) {
      call.first_tensor = &tensor;
      call.device = tensor.get_device();
    } else if (tensor.get_device() != call.device) {
      *why_not = "argument '" + param.name + "' is on another device than the first tensor";
      call.device = -1;
      return call;
    }
  }
  if (call.first_tensor == nullptr) *why_not = "no tensor argument tells the device";
  return call;
}

bool holds(const Assumption& assumption, const Arg& arg) {
  switch (assumption.kind) {
    case AssumptionKind::kAligned16:
      return reinterpret_cast<uintptr_t>(arg.pointer()) % 16 == 0;
    case AssumptionKind::kDiv16:
      return arg.kind() == Arg::Kind::kInt && arg.as_int() % 16 == 0;
    case AssumptionKind::kEquals1:
      return arg.kind() == Arg::Kind::kInt && arg.as_int() == 1;
  }
  return false;
}

Variant* select(const KernelImpl& kernel, c10::ArrayRef<Arg> args, int device,
                std::string* why_not) {
  std::string driver_why;
  if (cuda::driver(&driver_why) == nullptr) {
    *why_not = driver_why;
    return nullptr;
  }
  TORCH_CHECK(device >= 0 && static_cast<size_t>(device) < kMaxDevices, "opreg: CUDA device index ",
              device, " out of range");
  int capability = compute_capability(device);
  int arch = best_arch(kernel, capability);
  if (arch < 0) {
    *why_not = "no binary for compute capability " + std::to_string(capability / 10) + "." +
               std::to_string(capability % 10);
    return nullptr;
  }
  const Arg* argv = args.data();
  for (const auto& variant : kernel.variants) {
    if (variant->arch != arch) continue;
    bool fits = std::all_of(variant->assumptions.begin(), variant->assumptions.end(),
                            [&](const Assumption& a) { return holds(a, argv[a.param]); });
    if (fits) return variant.get();
  }
  *why_not = "no variant's assumptions hold for these arguments";
  return nullptr;
}

cuda::CUfunction function_on(const KernelImpl& kernel, Variant& variant, const cuda::Driver& d,
                             int device) {
  auto function = variant.functions[device].load(std::memory_order_acquire);
  if (function != nullptr) return function;
  std::lock_guard<std::mutex> lock(variant.load_mutex);
  function = variant.functions[device].load(std::memory_order_relaxed);
  if (function != nullptr) return function;
  cuda::CUmodule module;
  auto check = [&](cuda::CUresult result, const char* what) {
    TORCH_CHECK(result == cuda::kSuccess, "opreg: Triton kernel '", kernel.name, "' (sm_",
                variant.arch, ", ", variant.assumptions_text, "): ", what, " on cuda:", device,
                " failed: ", cuda::error_text(result));
  };
  check(d.cuModuleLoadData(&module, variant.binary.data()), "loading the module");
  check(d.cuModuleGetFunction(&function, module, variant.entry.c_str()), "finding the entry");
  if (variant.shared > kDefaultMaxSharedMemory) {
    check(d.cuFuncSetCacheConfig(function, cuda::kFuncCachePreferShared), "preferring shared");
    check(d.cuFuncSetAttribute(function, cuda::kFuncAttrMaxDynamicSharedSizeBytes,
                               static_cast<int>(variant.shared)),
          "raising the dynamic shared memory limit");
  }
  variant.functions[device].store(function, std::memory_order_release);
  return function;
}

// Slot for one parameter's bytes, as the kernel reads them.
void pack(const Param& param, const Arg& arg, uint64_t* slot, const std::string& kernel) {
  *slot = 0;
  auto check_range = [&](int64_t low, int64_t high) {
    TORCH_CHECK_VALUE(arg.as_int() >= low && arg.as_int() <= high, "opreg: Triton kernel '", kernel,
                      "': argument '", param.name, "' = ", arg.as_int(), " does not fit ",
                      param.type_name);
  };
  switch (param.type) {
    case ParamType::kPointer: {
      const void* pointer = arg.pointer();
      std::memcpy(slot, &pointer, sizeof(pointer));
      return;
    }
    case ParamType::kI1:
    case ParamType::kI8: {
      check_range(param.type == ParamType::kI1 ? 0 : INT8_MIN,
                  param.type == ParamType::kI1 ? 1 : INT8_MAX);
      auto value = static_cast<int8_t>(arg.as_int());
      std::memcpy(slot, &value, sizeof(value));
      return;
    }
    case ParamType::kI16: {
      check_range(INT16_MIN, INT16_MAX);
      auto value = static_cast<int16_t>(arg.as_int());
      std::memcpy(slot, &value, sizeof(value));
      return;
    }
    case ParamType::kI32:
    case ParamType::kU32: {
      if (param.type == ParamType::kI32) check_range(INT32_MIN, INT32_MAX);
      if (param.type == ParamType::kU32) check_range(0, UINT32_MAX);
      auto value = static_cast<uint32_t>(arg.as_int());
      std::memcpy(slot, &value, sizeof(value));
      return;
    }
    case ParamType::kI64:
    case ParamType::kU64: {
      auto value = arg.as_int();
      std::memcpy(slot, &value, sizeof(value));
      return;
    }
    case ParamType::kF16: {
      auto value = c10::Half(static_cast<float>(arg.as_float())).x;
      std::memcpy(slot, &value, sizeof(value));
      return;
    }
    case ParamType::kBF16: {
      auto value = c10::BFloat16(static_cast<float>(arg.as_float())).x;
      std::memcpy(slot, &value, sizeof(value));
      return;
    }
    case ParamType::kF32: {
      auto value = static_cast<float>(arg.as_float());
      std::memcpy(slot, &value, sizeof(value));
      return;
    }
    case ParamType::kF64: {
      auto value = arg.as_float();
      std::memcpy(slot, &value, sizeof(value));
      return;
    }
  }
}

at::Tensor scratch(int64_t per_program, int64_t align, int64_t programs, const at::Tensor& like) {
  return at::empty({per_program * programs + align}, like.options().dtype(at::kByte));
}

void* aligned_pointer(const at::Tensor& buffer, int64_t align) {
  auto address = reinterpret_cast<uintptr_t>(buffer.data_ptr());
  address = (address + align - 1) / align * align;
  return reinterpret_cast<void*>(address);
}

}  // namespace

const void* Arg::pointer() const {
  return kind_ == Kind::kTensor ? tensor_->const_data_ptr() : pointer_;
}

Kernel::Kernel(std::string name) : name_(std::move(name)) {}

KernelImpl& Kernel::impl() const {
  KernelImpl* kernel = find();
  TORCH_CHECK(kernel != nullptr,
              "opreg: no ahead-of-time binaries are registered for the Triton "
              "kernel '",
              name_,
              "' (build them with python -m opreg.aot, and link the generated "
              "source or call load_bundle_dir)");
  return *kernel;
}

bool Kernel::can_launch(c10::ArrayRef<Arg> args, std::string* why_not) const {
  std::string why = "no binaries are registered for it";
  KernelImpl* kernel = find();
  if (kernel != nullptr) {
    auto call = inspect(*kernel, args, &why);
    if (call.device >= 0 && select(*kernel, args, call.device, &why) != nullptr) return true;
  }
  if (why_not != nullptr) *why_not = why;
  return false;
}

KernelImpl* Kernel::find() const {
  if (impl_ != nullptr) return impl_;
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto found = reg.kernels.find(name_);
  if (found == reg.kernels.end()) return nullptr;
  impl_ = found->second.get();
  return impl_;
}

bool Kernel::available_on(int device, std::string* why_not) const {
  enum : uint8_t { kUnknown, kAvailable, kUnavailable };
  const bool in_range = device >= 0 && static_cast<size_t>(device) < kMaxDevices;
  if (in_range && why_not == nullptr) {
    auto known = availability_[device].load(std::memory_order_relaxed);
    if (known != kUnknown) return known == kAvailable;
  }
  std::string why;
  bool available = false;
  KernelImpl* kernel = find();
  if (!in_range) {
    why = "CUDA device index " + std::to_string(device) + " out of range";
  } else if (kernel == nullptr) {
    why = "no binaries are registered for it";  // not cached: a bundle may be loaded later
  } else if (cuda::driver(&why) != nullptr) {
    int capability = compute_capability(device);
    available = best_arch(*kernel, capability) >= 0;
    if (!available) {
      why = "no binary for compute capability " + std::to_string(capability / 10) + "." +
            std::to_string(capability % 10);
    }
  }
  if (in_range && kernel != nullptr) {
    availability_[device].store(available ? kAvailable : kUnavailable, std::memory_order_relaxed);
  }
  if (why_not != nullptr) *why_not = why;
  return available;
}

std::string Kernel::variant_for(c10::ArrayRef<Arg> args) const {
  std::string why = "no binaries are registered for it";
  KernelImpl* kernel = find();
  if (kernel != nullptr) {
    auto call = inspect(*kernel, args, &why);
    Variant* variant = call.device >= 0 ? select(*kernel, args, call.device, &why) : nullptr;
    if (variant != nullptr) {
      return "sm_" + std::to_string(variant->arch) + " [" + variant->assumptions_text + "]";
    }
  }
  return "none: " + why;
}

void Kernel::launch(Grid grid, c10::ArrayRef<Arg> args) const {
  // 1. Validate the arguments and pick the variant.
  auto& kernel = impl();
  std::string why;
  auto call = inspect(kernel, args, &why);
  TORCH_CHECK(call.device >= 0, "opreg: cannot launch Triton kernel '", name_, "': ", why);
  Variant* variant = select(kernel, args, call.device, &why);
  TORCH_CHECK(variant != nullptr, "opreg: cannot launch Triton kernel '", name_,
              "' on cuda:", call.device, ": ", why);
  TORCH_CHECK_VALUE(grid.x >= 0 && grid.y >= 0 && grid.z >= 0 && grid.x < (int64_t{1} << 31) &&
                        grid.y < 65536 && grid.z < 65536,
                    "opreg: Triton kernel '", name_, "': grid (", grid.x, ", ", grid.y, ", ",
                    grid.z, ") is outside CUDA's limits (x < 2^31, y and z < 65536)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;

  // 2. Device, context, stream, module.
  const auto* d = cuda::driver();
  c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(call.device));
  c10::DeviceGuard guard(device);
  cuda::make_context_current(*d, call.device);
  auto stream = static_cast<cuda::CUstream>(
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle());
  cuda::CUfunction function = function_on(kernel, *variant, *d, call.device);

  // 3. Parameters: every non-constant argument, then the global and profile scratch pointers.
  std::array<uint64_t, kMaxParams + 2> slots;
  std::array<void*, kMaxParams + 2> params;
  size_t count = 0;
  const Arg* argv = args.data();
  for (size_t i = 0; i < kernel.params.size(); ++i) {
    if (variant->dropped[i]) continue;
    pack(kernel.params[i], argv[i], &slots[count], name_);
    params[count] = &slots[count];
    ++count;
  }
  const int64_t programs = grid.x * grid.y * grid.z * variant->num_ctas;
  at::Tensor global_scratch, profile_scratch;
  void* global_pointer = nullptr;
  void* profile_pointer = nullptr;
  if (variant->global_scratch_size > 0) {
    global_scratch = scratch(variant->global_scratch_size, variant->global_scratch_align, programs,
                             *call.first_tensor);
    global_pointer = aligned_pointer(global_scratch, variant->global_scratch_align);
  }
  if (variant->profile_scratch_size > 0) {
    profile_scratch = scratch(variant->profile_scratch_size, variant->profile_scratch_align,
                              programs, *call.first_tensor);
    profile_pointer = aligned_pointer(profile_scratch, variant->profile_scratch_align);
  }
  std::memcpy(&slots[count], &global_pointer, sizeof(void*));
  params[count] = &slots[count];
  ++count;
  std::memcpy(&slots[count], &profile_pointer, sizeof(void*));
  params[count] = &slots[count];

  // 4. Launch.
  const auto block = static_cast<unsigned>(32 * variant->num_warps);
  cuda::CUresult result;
  if (variant->num_ctas == 1 && !variant->launch_pdl && !variant->launch_cooperative_grid) {
    result =
        d->cuLaunchKernel(function, static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y),
                          static_cast<unsigned>(grid.z), block, 1, 1,
                          static_cast<unsigned>(variant->shared), stream, params.data(), nullptr);
  } else {
    std::array<cuda::LaunchAttribute, 3> attributes{};
    unsigned num_attributes = 0;
    if (variant->num_ctas > 1) {
      auto& a = attributes[num_attributes++];
      a.id = cuda::kLaunchAttrClusterDimension;
      a.value.cluster_dim = {static_cast<unsigned>(variant->num_ctas), 1, 1};
    }
    if (variant->launch_pdl) {
      auto& a = attributes[num_attributes++];
      a.id = cuda::kLaunchAttrProgrammaticStreamSerialization;
      a.value.programmatic_stream_serialization_allowed = 1;
    }
    if (variant->launch_cooperative_grid) {
      auto& a = attributes[num_attributes++];
      a.id = cuda::kLaunchAttrCooperative;
      a.value.cooperative = 1;
    }
    cuda::LaunchConfig config{static_cast<unsigned>(grid.x * variant->num_ctas),
                              static_cast<unsigned>(grid.y),
                              static_cast<unsigned>(grid.z),
                              block,
                              1,
                              1,
                              static_cast<unsigned>(variant->shared),
                              stream,
                              attributes.data(),
                              num_attributes};
    result = d->cuLaunchKernelEx(&config, function, params.data(), nullptr);
  }
  TORCH_CHECK(result == cuda::kSuccess, "opreg: launching Triton kernel '", name_, "' (sm_",
              variant->arch, ", ", variant->assumptions_text, ") with grid (", grid.x, ", ", grid.y,
              ", ", grid.z, ") on cuda:", call.device, " failed: ", cuda::error_text(result));
}

bool register_embedded_bundle(const char* manifest, size_t manifest_size, const EmbeddedFile* files,
                              size_t num_files) {
  add_kernel(parse_manifest(std::string(manifest, manifest_size), [&](const std::string& name) {
    for (size_t i = 0; i < num_files; ++i) {
      if (name == files[i].name) {
        return std::string(reinterpret_cast<const char*>(files[i].data), files[i].size);
      }
    }
    TORCH_CHECK_VALUE(false, "opreg: embedded Triton bundle lacks the binary '", name, "'");
  }));
  return true;
}

std::vector<std::string> load_bundle_dir(const std::string& path) {
  auto read = [&](const std::string& name) {
    std::ifstream file(path + "/" + name, std::ios::binary);
    TORCH_CHECK_VALUE(file.good(), "opreg: cannot read ", path, "/", name);
    return std::string(std::istreambuf_iterator<char>(file), {});
  };
  std::vector<std::string> names;
  std::ifstream index(path + "/index.txt");
  TORCH_CHECK_VALUE(index.good(), "opreg: ", path,
                    " has no index.txt; is it a folder written by python -m opreg.aot?");
  for (std::string manifest; std::getline(index, manifest);) {
    if (manifest.empty()) continue;
    auto kernel = parse_manifest(read(manifest), read);
    names.push_back(kernel->name);
    add_kernel(std::move(kernel));
  }
  return names;
}

std::vector<KernelReport> describe_kernels() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<KernelReport> reports;
  for (const auto& [name, kernel] : reg.kernels) {
    KernelReport report{name, kernel->source, {}, {}};
    for (const auto& param : kernel->params)
      report.params.push_back(param.name + ": " + param.type_name);
    for (const auto& variant : kernel->variants) {
      report.variants.push_back(
          {variant->arch, variant->assumptions_text, variant->config_text, variant->shared});
    }
    reports.push_back(std::move(report));
  }
  return reports;
}

bool driver_available(std::string* why_not) { return cuda::driver(why_not) != nullptr; }

}  // namespace opreg::triton
