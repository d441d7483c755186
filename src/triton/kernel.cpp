// src/triton/kernel.cpp: the registry of ahead-of-time compiled Triton kernels, and their launch:
// pick the variant that fits the arguments and the device, load its module on that device once,
// pack the parameters and launch on PyTorch's current stream (both through launch.h).
#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>
#include <nlohmann/json.hpp>

#include "../core/load_internal.h"
#include "cuda_driver.h"
#include "launch.h"
#include "opreg/detail/text.h"
#include "opreg/triton.h"

namespace opreg::triton {

// A C identifier, or with `dollar` a PTX one (a cubin's function names).
static bool is_name(const std::string& name, bool dollar) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [&](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || (dollar && c == '$');
  });
}

bool is_identifier(const std::string& name) { return is_name(name, false); }

constexpr size_t kMaxDevices = 64;
constexpr int64_t kDefaultMaxSharedMemory = 48 * 1024;

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
  // Set when a library opened outside opreg::load_library embeds another kernel of this name
  // (kernels are found by name, so its ops would launch this one: neither is launched from then),
  // and when a failed load takes the kernel back (remove_kernels): a Kernel that found it refuses.
  std::atomic<bool> clashed{false};
};

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<KernelImpl>> kernels;
  // Embedded bundles that failed to register (at load time, where an exception would abort the
  // process): the kernel's name (or "" when unreadable) -> the error, told when it is used.
  std::map<std::string, std::string> failures;
};

Registry& registry() {
  static Registry* instance = new Registry();  // leaked: kernels outlive every static user
  return *instance;
}

// Why the kernel's embedded bundle failed to register, or "".
std::string failure_of(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto found = reg.failures.find(name);
  return found == reg.failures.end() ? "" : found->second;
}

// The tensor dtype a pointer parameter reads ("*fp32" -> Float), when the kernel says.
std::optional<at::ScalarType> pointee_dtype(const std::string& type) {
  static const auto& types = *new std::unordered_map<std::string, at::ScalarType>{
      {"*fp16", at::kHalf}, {"*bf16", at::kBFloat16}, {"*fp32", at::kFloat}, {"*fp64", at::kDouble},
      {"*i8", at::kChar},   {"*u8", at::kByte},       {"*i16", at::kShort},  {"*i32", at::kInt},
      {"*i64", at::kLong},  {"*i1", at::kBool}};
  auto found = types.find(type);
  if (found == types.end()) return std::nullopt;
  return found->second;
}

// What a pointer parameter may point to: the scalar types and Triton's fp8 types (the same list
// as POINTEE_TYPES in python/opreg/aot/compile.py).
bool is_pointee_type(const std::string& type) {
  static const char* const fp8_types[] = {"fp8e4nv", "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16"};
  const auto scalar = param_type_of(type);
  return (scalar.has_value() && *scalar != ParamType::kPointer) ||
         std::any_of(std::begin(fp8_types), std::end(fp8_types),
                     [&](const char* fp8) { return type == fp8; });
}

ParamType parse_type(const std::string& kernel, const std::string& type) {
  if (!type.empty() && type[0] == '*') {
    TORCH_CHECK_VALUE(is_pointee_type(type.substr(1)), kernel, ": unsupported parameter type '",
                      type, "' (expected a pointer to i1, i8, i16, i32, i64, u8, u16, u32, u64, ",
                      "fp16, bf16, fp32, fp64 or an fp8 type such as '*fp8e4nv')");
    return ParamType::kPointer;
  }
  const auto parsed = param_type_of(type);
  TORCH_CHECK_VALUE(parsed.has_value(), kernel, ": unsupported parameter type '", type,
                    "' (expected a pointer '*...', i1, i8, i16, i32, i64, u8, u16, u32, u64, "
                    "fp16, bf16, fp32 or fp64)");
  return *parsed;
}

// The launcher packs every parameter not specialized away, then the two scratch pointers; the
// binary's entry (its PTX, read by the compiler) must expect exactly that.
void check_layout(const std::string& where, const KernelImpl& kernel, const Variant& variant,
                  const std::vector<int>& ptx) {
  std::vector<int> packed;
  for (size_t i = 0; i < kernel.params.size(); ++i) {
    if (!variant.dropped[i]) packed.push_back(param_size(kernel.params[i].type));
  }
  packed.push_back(8);
  packed.push_back(8);
  TORCH_CHECK_VALUE(
      packed == ptx, where, " (sm_", variant.arch, ", ", variant.assumptions_text,
      "): field 'param_sizes': the binary expects ", ptx.size(), " parameters of sizes ",
      c10::IntArrayRef(std::vector<int64_t>(ptx.begin(), ptx.end())), ", the launcher would pack ",
      c10::IntArrayRef(std::vector<int64_t>(packed.begin(), packed.end())),
      "; rebuild it with this opreg's python -m opreg.aot");
}

// Whether `bytes` look like a whole cubin: an ELF64 little-endian image for EM_CUDA whose program
// and section header tables lie inside it. cuModuleLoadData takes no size and trusts these
// offsets, so a truncated file would be read past its end. Empty when it does; else why not.
std::string cubin_problem(const std::string& bytes) {
  constexpr size_t kHeaderSize = 64;
  constexpr uint16_t kMachineCuda = 190;
  if (bytes.empty()) return "it is empty";
  if (bytes.size() < kHeaderSize || bytes.compare(0, 4,
                                                  "\x7f"
                                                  "ELF") != 0) {
    return "it is not an ELF file (" + std::to_string(bytes.size()) + " bytes)";
  }
  auto read = [&](size_t offset, size_t size) {
    uint64_t value = 0;
    for (size_t i = 0; i < size; ++i) {
      value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
    }
    return value;
  };
  if (bytes[4] != 2 || bytes[5] != 1) return "it is not a 64-bit little-endian ELF file";
  if (read(18, 2) != kMachineCuda) {
    return "its ELF machine is " + std::to_string(read(18, 2)) + ", not CUDA (190)";
  }
  const uint64_t size = bytes.size();
  const uint64_t tables[2][2] = {{read(32, 8), read(54, 2) * read(56, 2)},
                                 {read(40, 8), read(58, 2) * read(60, 2)}};
  for (const auto& [offset, length] : tables) {
    if (offset > size || length > size - offset) {
      return "it is truncated: its ELF header points past its " + std::to_string(size) + " bytes";
    }
  }
  return "";
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of("/\\") == std::string::npos && name.find('\0') == std::string::npos;
}

using opreg::detail::escaped;

// The bytes of the file at `path`; a ValueError naming it (and `named_by`: where its name was
// read) when it is missing, unreadable, a directory or not a regular file (a FIFO would block).
std::string read_bundle_file(const std::string& path, const std::string& named_by) {
  const auto where = escaped(path) + (named_by.empty() ? "" : " (" + named_by + ")");
  std::error_code error;
  const auto type = std::filesystem::status(path, error).type();
  TORCH_CHECK_VALUE(type != std::filesystem::file_type::not_found, "opreg: cannot read ", where,
                    ": no such file");
  TORCH_CHECK_VALUE(!error, "opreg: cannot read ", where, ": ", error.message());
  TORCH_CHECK_VALUE(type != std::filesystem::file_type::directory, "opreg: cannot read ", where,
                    ": it is a directory, not a file");
  TORCH_CHECK_VALUE(type == std::filesystem::file_type::regular, "opreg: cannot read ", where,
                    ": it is not a regular file");
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK_VALUE(file.good(), "opreg: cannot read ", where, ": ", std::strerror(errno));
  try {
    return std::string(std::istreambuf_iterator<char>(file), {});
  } catch (const std::exception& failure) {
    TORCH_CHECK_VALUE(false, "opreg: cannot read ", where, ": ", failure.what());
  }
}

// Reads the fields of a manifest with errors that name the file, the kernel, the variant and the
// field: "opreg: Triton manifest b/k.json: kernel 'k', variant 2: field 'num_warps' ...".
class ManifestReader {
 public:
  explicit ManifestReader(const std::string& origin)
      : where_("opreg: Triton manifest " + opreg::detail::valid_utf8(origin)) {}
  const std::string& where() const { return where_; }
  void set_kernel(const std::string& name) { kernel_where_ = where_ + ": kernel '" + name + "'"; }
  void set_variant(size_t index) {
    variant_where_ = kernel_where_ + ", variant " + std::to_string(index);
  }
  void leave_variants() { variant_where_.clear(); }
  const std::string& context() const {
    if (!variant_where_.empty()) return variant_where_;
    return kernel_where_.empty() ? where_ : kernel_where_;
  }

  const nlohmann::json& field(const nlohmann::json& object, const char* name) const {
    TORCH_CHECK_VALUE(object.is_object(), context(), ": expected an object, got ", shown(object));
    auto found = object.find(name);
    TORCH_CHECK_VALUE(found != object.end(), context(), ": field '", name, "' is missing");
    return *found;
  }
  int64_t integer(const nlohmann::json& object, const char* name, int64_t low, int64_t high) const {
    const auto& value = field(object, name);
    const bool fits =
        value.is_number_integer() &&
        !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
    TORCH_CHECK_VALUE(fits && value.get<int64_t>() >= low && value.get<int64_t>() <= high,
                      context(), ": field '", name, "' must be an integer from ", low, " to ", high,
                      ", got ", shown(value));
    return value.get<int64_t>();
  }
  std::string string(const nlohmann::json& object, const char* name) const {
    const auto& value = field(object, name);
    TORCH_CHECK_VALUE(value.is_string() && !value.get<std::string>().empty(), context(),
                      ": field '", name, "' must be a non-empty string, got ", shown(value));
    return value.get<std::string>();
  }
  bool boolean(const nlohmann::json& object, const char* name) const {
    const auto& value = field(object, name);
    TORCH_CHECK_VALUE(value.is_boolean(), context(), ": field '", name,
                      "' must be true or false, got ", shown(value));
    return value.get<bool>();
  }
  const nlohmann::json& array(const nlohmann::json& object, const char* name) const {
    const auto& value = field(object, name);
    TORCH_CHECK_VALUE(value.is_array(), context(), ": field '", name, "' must be a list, got ",
                      shown(value));
    return value;
  }
  // Refuses a key of `object` that is not in `known`: a field python3 -m opreg.aot does not write
  // would be loaded and never read. `in` says where the object is, `has` what it holds.
  void only_fields(const nlohmann::json& object, const std::set<std::string>& known,
                   const std::string& in, const char* has) const {
    TORCH_CHECK_VALUE(object.is_object(), context(), ": expected an object, got ", shown(object));
    for (const auto& item : object.items()) {
      TORCH_CHECK_VALUE(known.count(item.key()), context(), ": unknown field ", shown(item.key()),
                        in, "; ", has);
    }
  }
  // A power of two from 1 to `high`.
  int64_t power_of_two(const nlohmann::json& object, const char* name, int64_t high) const {
    const int64_t value = integer(object, name, 1, high);
    TORCH_CHECK_VALUE((value & (value - 1)) == 0, context(), ": field '", name,
                      "' must be a power of two, got ", value);
    return value;
  }

  static std::string shown(const nlohmann::json& value) {
    auto text = value.dump();
    return text.size() > 60 ? text.substr(0, 57) + "..." : text;
  }

 private:
  std::string where_, kernel_where_, variant_where_;
};

constexpr int64_t kMaxWarps = 32;  // 1024 threads per block
constexpr int64_t kMaxCtas = 16;   // the largest (non-portable) cluster
constexpr int64_t kMaxInt32 = INT32_MAX;
constexpr int64_t kMaxStages = 16;      // python/opreg/aot/compile.py MAX_STAGES
constexpr int64_t kMaxRegisters = 255;  // per thread (compile.py MAX_REGISTERS)

template <class ReadFile>
std::unique_ptr<KernelImpl> parse_fields(const nlohmann::json& manifest, ManifestReader& in,
                                         ReadFile read_file);

// How deeply arrays and objects nest in a JSON text (strings skipped). The JSON parser recurses
// per level, so a manifest is measured before it is parsed.
size_t json_nesting(const std::string& text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

constexpr size_t kMaxManifestNesting = 16;

// Parses JSON text, refusing an object that gives one key twice: a parser keeps one of the two
// values (this one the last), so a manifest holding both would be read as whichever wins.
nlohmann::json parse_json_once_per_key(const std::string& text, const ManifestReader& in) {
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> open_objects;
  std::optional<std::string> repeated;
  auto note_keys = [&](int /*depth*/, Event event, nlohmann::json& parsed) {
    if (event == Event::object_start) {
      open_objects.emplace_back();
    } else if (event == Event::object_end) {
      open_objects.pop_back();
    } else if (event == Event::key && !repeated) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second) repeated = key;
    }
    return true;
  };
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(text, note_keys);
  } catch (const nlohmann::json::exception& error) {
    TORCH_CHECK_VALUE(false, in.where(),
                      " is not valid JSON: ", opreg::detail::valid_utf8(error.what()));
  }
  TORCH_CHECK_VALUE(!repeated, in.where(), ": an object gives the key '", *repeated,
                    "' twice; it is not a manifest of python3 -m opreg.aot");
  return parsed;
}

// Parses a manifest read from `origin` (a path, or "embedded ..."); `read_file(name)` gives the
// bytes of a binary it names. Every field is checked: a manifest is data, not trusted code.
template <class ReadFile>
std::unique_ptr<KernelImpl> parse_manifest(const std::string& text, const std::string& origin,
                                           ReadFile read_file) {
  ManifestReader in(origin);
  TORCH_CHECK_VALUE(json_nesting(text) <= kMaxManifestNesting, in.where(),
                    ": arrays and objects nest deeper than a manifest's ", kMaxManifestNesting,
                    " levels; it is not a manifest of python3 -m opreg.aot");
  const nlohmann::json manifest = parse_json_once_per_key(text, in);
  TORCH_CHECK_VALUE(manifest.is_object(), in.where(), ": expected a JSON object, got ",
                    ManifestReader::shown(manifest));
  const auto format = manifest.value("format", nlohmann::json()).dump();
  TORCH_CHECK_VALUE(manifest.value("format", nlohmann::json()) == "opreg-triton-aot/1", in.where(),
                    ": field 'format' must be \"opreg-triton-aot/1\", got ", format,
                    "; rebuild it with python -m opreg.aot");
  try {
    return parse_fields(manifest, in, read_file);
  } catch (const nlohmann::json::exception& error) {  // a check above missed a malformed field
    TORCH_CHECK_VALUE(false, in.context(), ": ", error.what());
  }
}

template <class ReadFile>
std::unique_ptr<KernelImpl> parse_fields(const nlohmann::json& manifest, ManifestReader& in,
                                         ReadFile read_file) {
  auto kernel = std::make_unique<KernelImpl>();
  kernel->name = in.string(manifest, "kernel");
  TORCH_CHECK_VALUE(is_identifier(kernel->name), in.where(),
                    ": field 'kernel' must be a C identifier, got ",
                    ManifestReader::shown(manifest.at("kernel")));
  in.set_kernel(kernel->name);
  in.only_fields(manifest, {"format", "kernel", "source", "params", "variants"}, "",
                 "a manifest has format, kernel, source, params and variants");
  if (manifest.contains("source")) kernel->source = in.string(manifest, "source");
  const auto& params = in.array(manifest, "params");
  TORCH_CHECK_VALUE(params.size() <= kMaxParams, in.context(), ": field 'params' has ",
                    params.size(), " parameters, at most ", kMaxParams, " are supported");
  for (const auto& param : params) {
    auto name = in.string(param, "name");
    auto type = in.string(param, "type");
    in.only_fields(param, {"name", "type"}, " of parameter '" + name + "'",
                   "a parameter has name and type");
    for (const auto& earlier : kernel->params) {
      TORCH_CHECK_VALUE(earlier.name != name, in.context(), ": field 'params' names parameter '",
                        name, "' twice");
    }
    kernel->params.push_back({name, type,
                              parse_type(in.context() + ", parameter '" + name + "'", type),
                              pointee_dtype(type)});
  }
  const auto& variants = in.array(manifest, "variants");
  TORCH_CHECK_VALUE(!variants.empty(), in.context(),
                    ": field 'variants' is empty: the kernel has no binary");
  for (const auto& raw : variants) {
    in.set_variant(kernel->variants.size());
    TORCH_CHECK_VALUE(raw.is_object(), in.context(), ": expected a JSON object, got ",
                      ManifestReader::shown(raw));
    in.only_fields(
        raw,
        {"arch", "entry", "num_warps", "num_ctas", "shared", "global_scratch_size",
         "global_scratch_align", "profile_scratch_size", "profile_scratch_align", "launch_pdl",
         "launch_cooperative_grid", "assumptions", "config", "param_sizes", "file"},
        "",
        "a variant has the fields python3 -m opreg.aot writes (arch, entry, "
        "num_warps, num_ctas, shared, the scratch sizes and alignments, launch_pdl, "
        "launch_cooperative_grid, assumptions, config, param_sizes, file)");
    auto variant = std::make_unique<Variant>();
    variant->arch = static_cast<int>(in.integer(raw, "arch", 10, 9999));
    variant->entry = in.string(raw, "entry");
    // The entry reaches the driver as a C string.
    TORCH_CHECK_VALUE(is_name(variant->entry, /*dollar=*/true), in.context(),
                      ": field 'entry' must name the kernel's function in its cubin (letters, "
                      "digits, _ and $, not starting with a digit), got ",
                      ManifestReader::shown(raw.at("entry")));
    // Triton compiles only a power of two of warps (CUDAOptions.__post_init__).
    variant->num_warps = static_cast<int>(in.power_of_two(raw, "num_warps", kMaxWarps));
    variant->num_ctas = static_cast<int>(in.integer(raw, "num_ctas", 1, kMaxCtas));
    variant->shared = in.integer(raw, "shared", 0, kMaxInt32);
    variant->global_scratch_size = in.integer(raw, "global_scratch_size", 0, kMaxInt32);
    variant->global_scratch_align = in.power_of_two(raw, "global_scratch_align", 1 << 16);
    variant->profile_scratch_size = in.integer(raw, "profile_scratch_size", 0, kMaxInt32);
    variant->profile_scratch_align = in.power_of_two(raw, "profile_scratch_align", 1 << 16);
    variant->launch_pdl = in.boolean(raw, "launch_pdl");
    variant->launch_cooperative_grid = in.boolean(raw, "launch_cooperative_grid");
    variant->dropped.assign(kernel->params.size(), false);
    std::ostringstream assumptions;
    std::vector<bool> assumed(kernel->params.size(), false);
    for (const auto& a : in.array(raw, "assumptions")) {
      TORCH_CHECK_VALUE(!kernel->params.empty(), in.context(),
                        ": a variant's assumption names a parameter, but 'params' is empty");
      const auto param = static_cast<size_t>(
          in.integer(a, "param", 0, static_cast<int64_t>(kernel->params.size()) - 1));
      const auto kind_text = in.string(a, "kind");
      const auto& p = kernel->params[param];
      in.only_fields(a, {"param", "kind"}, " of an assumption on parameter '" + p.name + "'",
                     "an assumption has param and kind");
      AssumptionKind kind;
      if (kind_text == "aligned16") {
        kind = AssumptionKind::kAligned16;
      } else if (kind_text == "div16") {
        kind = AssumptionKind::kDiv16;
      } else {
        TORCH_CHECK_VALUE(kind_text == "equals1", in.context(), ": field 'kind' of parameter '",
                          p.name, "' must be aligned16, div16 or equals1, got '", kind_text, "'");
        kind = AssumptionKind::kEquals1;
      }
      const bool pointer = p.type == ParamType::kPointer;
      TORCH_CHECK_VALUE(
          kind == AssumptionKind::kAligned16 ? pointer : is_integer_type(p.type), in.context(),
          ": assumption '", kind_text, "' on parameter '", p.name, "' (", p.type_name, ") needs ",
          kind == AssumptionKind::kAligned16 ? "a pointer" : "an integer", " parameter");
      TORCH_CHECK_VALUE(!assumed[param], in.context(), ": parameter '", p.name,
                        "' has more than one assumption");
      assumed[param] = true;
      if (kind == AssumptionKind::kEquals1) variant->dropped[param] = true;
      assumptions << (variant->assumptions.empty() ? "" : ", ") << p.name << ":" << kind_text;
      variant->assumptions.push_back({param, kind});
    }
    variant->assumptions_text = variant->assumptions.empty() ? "generic" : assumptions.str();
    std::ostringstream config;
    const auto config_json = raw.value("config", nlohmann::json::object());
    TORCH_CHECK_VALUE(config_json.is_object(), in.context(),
                      ": field 'config' must be an object, got ",
                      ManifestReader::shown(config_json));
    in.only_fields(config_json, {"num_warps", "num_stages", "num_ctas", "maxnreg"},
                   " in field 'config'", "a config has num_warps, num_stages, num_ctas, maxnreg");
    // The values python3 -m opreg.aot takes in a spec's configs (python/opreg/aot/compile.py
    // check_kernel_spec): the config describes the binary in reports and tells variants apart.
    struct ConfigLimit {
      const char* key;
      const char* expected;
      int64_t high;
    };
    for (const auto& limit :
         std::array<ConfigLimit, 4>{{{"num_warps", "a power of two", kMaxWarps},
                                     {"num_stages", "a pipeline depth", kMaxStages},
                                     {"num_ctas", "a CTA count", kMaxCtas},
                                     {"maxnreg", "a register count", kMaxRegisters}}}) {
      if (!config_json.contains(limit.key)) continue;
      const nlohmann::json& value = config_json.at(limit.key);
      const bool fits =
          value.is_number_integer() &&
          !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
      const int64_t number = fits ? value.get<int64_t>() : 0;
      const bool power = std::strcmp(limit.key, "num_warps") != 0 || (number & (number - 1)) == 0;
      TORCH_CHECK_VALUE(fits && number >= 1 && number <= limit.high && power, in.context(),
                        ": field 'config' entry '", limit.key, "' must be ", limit.expected,
                        " from 1 to ", limit.high, " (an integer), got ",
                        ManifestReader::shown(value));
    }
    for (const auto& [key, value] : config_json.items()) {
      config << (config.tellp() > 0 ? " " : "") << key << "=" << value;
    }
    variant->config_text = config.str();
    // The launch takes num_warps and num_ctas from the variant's fields: a config that says
    // otherwise was compiled for another block shape.
    for (const auto& [key, field] : {std::pair<const char*, int>{"num_warps", variant->num_warps},
                                     std::pair<const char*, int>{"num_ctas", variant->num_ctas}}) {
      TORCH_CHECK_VALUE(!config_json.contains(key) || config_json[key] == field, in.context(),
                        ": field 'config' says ", key, " = ",
                        ManifestReader::shown(config_json[key]), ", field '", key, "' says ", field,
                        "; the manifest contradicts itself");
    }
    for (size_t earlier = 0; earlier < kernel->variants.size(); ++earlier) {
      const auto& other = *kernel->variants[earlier];
      TORCH_CHECK_VALUE(other.arch != variant->arch ||
                            other.assumptions_text != variant->assumptions_text ||
                            other.config_text != variant->config_text,
                        in.context(), ": repeats variant ", earlier, " (arch ", variant->arch,
                        ", assumptions ", variant->assumptions_text, ", config '",
                        variant->config_text, "'): one of them would never be launched");
    }
    std::vector<int> param_sizes;
    for (const auto& size : in.array(raw, "param_sizes")) {
      TORCH_CHECK_VALUE(
          size.is_number_integer() && size.get<int64_t>() > 0 && size.get<int64_t>() <= 8,
          in.context(), ": field 'param_sizes' must list sizes from 1 to 8, got ",
          ManifestReader::shown(size));
      param_sizes.push_back(size.get<int>());
    }
    check_layout(in.context(), *kernel, *variant, param_sizes);
    const auto file = in.string(raw, "file");
    TORCH_CHECK_VALUE(is_plain_file_name(file), in.context(),
                      ": field 'file' must be a file name beside the manifest, got '", file, "'");
    variant->binary = read_file(file);
    const auto problem = cubin_problem(variant->binary);
    TORCH_CHECK_VALUE(problem.empty(), in.context(), ": binary '", file,
                      "' is not a cubin: ", problem);
    kernel->variants.push_back(std::move(variant));
  }
  // python3 -m opreg.aot writes a variant without assumptions for every arch: a launch whose
  // arguments break the others' assumptions (an unaligned pointer) takes it.
  in.leave_variants();
  for (const auto& variant : kernel->variants) {
    const int arch = variant->arch;
    TORCH_CHECK_VALUE(std::any_of(kernel->variants.begin(), kernel->variants.end(),
                                  [&](const auto& other) {
                                    return other->arch == arch && other->assumptions.empty();
                                  }),
                      in.context(), ": no generic variant (one without assumptions) for sm_", arch,
                      ": a launch whose arguments break its variants' assumptions would have no "
                      "binary; python3 -m opreg.aot writes one for every arch");
  }
  return kernel;
}

// Whether two registrations are one kernel: the same bundle loaded twice (a library and a folder
// of the same build) is harmless; two different kernels under one name are a mistake.
// A rebuilt kernel under the old name is no such bundle: its binaries or launch fields differ.
bool same_variant(const Variant& a, const Variant& b) {
  return a.arch == b.arch && a.assumptions_text == b.assumptions_text &&
         a.config_text == b.config_text && a.entry == b.entry && a.num_warps == b.num_warps &&
         a.num_ctas == b.num_ctas && a.shared == b.shared &&
         a.global_scratch_size == b.global_scratch_size &&
         a.global_scratch_align == b.global_scratch_align &&
         a.profile_scratch_size == b.profile_scratch_size &&
         a.profile_scratch_align == b.profile_scratch_align && a.launch_pdl == b.launch_pdl &&
         a.launch_cooperative_grid == b.launch_cooperative_grid && a.dropped == b.dropped &&
         a.binary == b.binary;
}

bool same_kernel(const KernelImpl& a, const KernelImpl& b) {
  return a.source == b.source &&
         std::equal(a.params.begin(), a.params.end(), b.params.begin(), b.params.end(),
                    [](const Param& p, const Param& q) {
                      return p.name == q.name && p.type_name == q.type_name;
                    }) &&
         std::equal(a.variants.begin(), a.variants.end(), b.variants.begin(), b.variants.end(),
                    [](const auto& v, const auto& w) { return same_variant(*v, *w); });
}

// What sets a kernel apart from the registered one of its name, in words (for the error).
std::string difference(const KernelImpl& registered, const KernelImpl& loaded) {
  if (registered.source != loaded.source) {
    return "its source is " + loaded.source + ", the registered one's " + registered.source;
  }
  if (registered.variants.size() != loaded.variants.size()) {
    return "it has " + std::to_string(loaded.variants.size()) + " variants, the registered one " +
           std::to_string(registered.variants.size());
  }
  auto unmatched = [&](const auto& variant) {
    return std::none_of(registered.variants.begin(), registered.variants.end(),
                        [&](const auto& other) { return same_variant(*variant, *other); });
  };
  for (size_t i = 0; i < loaded.variants.size(); ++i) {
    if (unmatched(loaded.variants[i])) {
      return "its variant " + std::to_string(i) +
             " (launch fields and binary) is none of the registered one's";
    }
  }
  if (!std::equal(registered.params.begin(), registered.params.end(), loaded.params.begin(),
                  loaded.params.end(), [](const Param& p, const Param& q) {
                    return p.name == q.name && p.type_name == q.type_name;
                  })) {
    return "its parameters differ";
  }
  return "it has the registered one's variants in another order, which decides the variant a "
         "launch takes";
}

// Refuses `kernel` where a registered kernel, or one of `others`, has its name and differs.
void check_no_clash(const Registry& reg, const KernelImpl& kernel, const std::string& origin,
                    const std::vector<std::unique_ptr<KernelImpl>>& others,
                    const std::vector<std::string>& other_origins) {
  auto found = reg.kernels.find(kernel.name);
  TORCH_CHECK_VALUE(found == reg.kernels.end() || same_kernel(*found->second, kernel),
                    "opreg: ", origin, ": a Triton kernel named '", kernel.name,
                    "' is already registered, and this one differs: ",
                    found != reg.kernels.end() ? difference(*found->second, kernel) : "",
                    "; a registered kernel cannot be replaced in a running process: give the "
                    "rebuilt kernel another name, or load it in a new process");
  for (size_t j = 0; j < others.size(); ++j) {
    TORCH_CHECK_VALUE(others[j]->name != kernel.name || same_kernel(*others[j], kernel),
                      "opreg: ", origin, " and ", other_origins[j],
                      " define two different Triton kernels named '", kernel.name, "'");
  }
}

// Registers every kernel or, when one clashes with a registered kernel or another of the batch,
// none. `origins[i]` says where kernels[i] was read, for the error.
// Returns the kernels it registered (not those registered before: a bundle loaded twice).
std::vector<KernelImpl*> add_kernels(std::vector<std::unique_ptr<KernelImpl>> kernels,
                                     const std::vector<std::string>& origins) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<std::unique_ptr<KernelImpl>> checked;
  std::vector<std::string> checked_origins;
  for (size_t i = 0; i < kernels.size(); ++i) {
    check_no_clash(reg, *kernels[i], origins[i], checked, checked_origins);
    checked.push_back(std::move(kernels[i]));
    checked_origins.push_back(origins[i]);
  }
  std::vector<KernelImpl*> added;
  for (auto& kernel : checked) {
    if (reg.kernels.count(kernel->name) == 0) {
      added.push_back(kernel.get());
      reg.kernels.emplace(kernel->name, std::move(kernel));
    }
  }
  return added;
}

// Takes back kernels add_kernels registered: their names are free again. A Kernel may have found
// one meanwhile, so each stays allocated, and is never launched.
void remove_kernels(const std::vector<KernelImpl*>& added) {
  static auto* removed = new std::vector<std::unique_ptr<KernelImpl>>();  // leaked, as the registry
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  for (KernelImpl* kernel : added) {
    auto found = reg.kernels.find(kernel->name);
    if (found == reg.kernels.end() || found->second.get() != kernel) continue;
    kernel->clashed.store(true, std::memory_order_relaxed);
    removed->push_back(std::move(found->second));
    reg.kernels.erase(found);
  }
}

// Embedded kernels of a library that opreg::load_library loads wait for its load to succeed: a
// failed load registers none, and its kernels' names stay free. One batch per load.
struct StagedKernels {
  uint64_t load = 0;
  std::vector<std::unique_ptr<KernelImpl>> kernels;
  std::vector<std::string> origins;
  std::vector<KernelImpl*> added;  // once committed
};
// The batch of the load t_staged_load names, owned by that load's work for success: read only
// while that load runs. Plain values: the first use of a thread-local with a destructor takes
// the dynamic loader's lock.
thread_local uint64_t t_staged_load = 0;
thread_local StagedKernels* t_staged = nullptr;

void stage_kernel(std::unique_ptr<KernelImpl> kernel, const std::string& origin) {
  const uint64_t load = detail::current_load_id();
  if (t_staged_load != load) {
    auto staged = std::make_shared<StagedKernels>();
    staged->load = load;
    // Several batches commit when a load with nested loads succeeds: one that clashes (a nested
    // library's kernel of the same name) takes back those committed before it.
    detail::when_load_succeeds(
        [staged] {
          staged->added = add_kernels(std::move(staged->kernels), staged->origins);
          staged->kernels.clear();
        },
        [staged] { remove_kernels(staged->added); });
    t_staged = staged.get();
    t_staged_load = load;
  }
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    check_no_clash(reg, *kernel, origin, t_staged->kernels, t_staged->origins);
  }
  t_staged->kernels.push_back(std::move(kernel));
  t_staged->origins.push_back(origin);
}

// A kernel this thread's load has staged, or null.
KernelImpl* staged_kernel(const std::string& name) {
  if (t_staged_load == 0 || t_staged_load != detail::current_load_id()) return nullptr;
  for (auto& kernel : t_staged->kernels) {
    if (kernel && kernel->name == name) return kernel.get();
  }
  return nullptr;
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
    // A float's bits are not an integer's: never pack one as the other.
    if (is_integer_type(param.type) && arg.kind() == Arg::Kind::kFloat) {
      *why_not =
          "argument '" + param.name + "' must be an integer (" + param.type_name + "), got a float";
      return call;
    }
  }
  index = 0;
  for (const auto& arg : args) {
    const auto& param = kernel.params[index++];
    if (arg.kind() != Arg::Kind::kTensor) continue;
    const auto& tensor = arg.tensor();
    if (!tensor.defined()) {
      *why_not = "argument '" + param.name + "' is an undefined tensor";
      return call;
    }
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
  if (param.type == ParamType::kPointer) {
    pack_pointer(arg.pointer(), slot);
  } else if (is_integer_type(param.type)) {
    TORCH_CHECK_VALUE(pack_integer(param.type, arg.as_int(), slot), "opreg: Triton kernel '",
                      kernel, "': argument '", param.name, "' = ", arg.as_int(), " does not fit ",
                      param.type_name);
  } else {
    const double value =
        arg.kind() == Arg::Kind::kInt ? static_cast<double>(arg.as_int()) : arg.as_float();
    TORCH_CHECK_VALUE(pack_float(param.type, value, slot), "opreg: Triton kernel '", kernel,
                      "': argument '", param.name, "' = ", value, " does not fit ",
                      param.type_name);
  }
}

std::string not_registered_reason(const std::string& name) {
  const auto failure = failure_of(name);
  return failure.empty() ? "no binaries are registered for it"
                         : "its embedded bundle failed to load: " + failure;
}

at::Tensor scratch(const std::string& kernel, int64_t per_program, int64_t align, int64_t programs,
                   const at::Tensor& like) {
  int64_t bytes = 0;
  TORCH_CHECK_VALUE(!c10::mul_overflows(per_program, programs, &bytes) &&
                        !c10::add_overflows(bytes, align, &bytes),
                    "opreg: Triton kernel '", kernel, "': scratch of ", per_program,
                    " bytes for each of ", programs, " programs overflows 64 bits");
  return at::empty({bytes}, like.options().dtype(at::kByte));
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
  if (kernel == nullptr) {
    const auto failure = failure_of(name_);
    TORCH_CHECK(failure.empty(), "opreg: no ahead-of-time binaries are registered for the Triton ",
                "kernel '", opreg::detail::escaped(name_),
                "': its embedded bundle failed to load: ", failure);
    TORCH_CHECK(false, "opreg: no ahead-of-time binaries are registered for the Triton kernel '",
                opreg::detail::escaped(name_),
                "' (build them with python -m opreg.aot, and link the generated source or call "
                "load_bundle_dir)");
  }
  return *kernel;
}

namespace {

// The variant a launch of `kernel` (null: not registered) with these arguments would use; null
// with `why` set when none fits.
Variant* variant_fitting(const std::string& name, KernelImpl* kernel, c10::ArrayRef<Arg> args,
                         std::string* why) {
  if (kernel == nullptr) {
    *why = not_registered_reason(name);
    return nullptr;
  }
  auto call = inspect(*kernel, args, why);
  return call.device >= 0 ? select(*kernel, args, call.device, why) : nullptr;
}

}  // namespace

bool Kernel::can_launch(c10::ArrayRef<Arg> args, std::string* why_not) const {
  std::string why;
  if (variant_fitting(name_, find(), args, &why) != nullptr) return true;
  if (why_not != nullptr) *why_not = why;
  return false;
}

KernelImpl* Kernel::find() const {
  KernelImpl* kernel = impl_.load();
  if (kernel == nullptr) {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto found = reg.kernels.find(name_);
    if (found == reg.kernels.end()) return nullptr;
    kernel = found->second.get();
    impl_ = kernel;
  }
  return kernel->clashed.load(std::memory_order_relaxed) ? nullptr : kernel;
}

bool Kernel::available_on(int device, std::string* why_not) const {
  enum : uint8_t { kUnknown, kAvailable, kUnavailable };
  const bool in_range = device >= 0 && static_cast<size_t>(device) < kMaxDevices;
  if (in_range && why_not == nullptr) {
    auto known = availability_[device].load(std::memory_order_relaxed);
    if (known == kUnavailable) return false;
    if (known == kAvailable && find() != nullptr) return true;
  }
  std::string why;
  bool available = false;
  KernelImpl* kernel = find();
  if (!in_range) {
    why = "CUDA device index " + std::to_string(device) + " out of range";
  } else if (kernel == nullptr) {
    why = not_registered_reason(name_);  // not cached: a bundle may be loaded later
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

std::optional<std::vector<Parameter>> Kernel::parameters() const {
  // A library's own ops check their launches against its kernels while it loads.
  KernelImpl* kernel = find();
  if (kernel == nullptr && detail::loading_library()) kernel = staged_kernel(name_);
  if (kernel == nullptr) return std::nullopt;
  std::vector<Parameter> params;
  for (const auto& param : kernel->params) params.push_back({param.name, param.type_name});
  return params;
}

std::string Kernel::variant_for(c10::ArrayRef<Arg> args) const {
  std::string why;
  const Variant* variant = variant_fitting(name_, find(), args, &why);
  if (variant == nullptr) return "none: " + why;
  return "sm_" + std::to_string(variant->arch) + " [" + variant->assumptions_text + "]";
}

void Kernel::launch(Grid grid, c10::ArrayRef<Arg> args) const {
  // 1. Validate the grid and the arguments, and pick the variant.
  TORCH_CHECK_VALUE(grid.x >= 0 && grid.y >= 0 && grid.z >= 0 && grid.x < (int64_t{1} << 31) &&
                        grid.y < 65536 && grid.z < 65536,
                    "opreg: Triton kernel '", opreg::detail::escaped(name_), "': grid (", grid.x,
                    ", ", grid.y, ", ", grid.z,
                    ") is outside CUDA's limits (x < 2^31, y and z < 65536)");
  auto& kernel = impl();
  std::string why;
  auto call = inspect(kernel, args, &why);
  TORCH_CHECK(call.device >= 0, "opreg: cannot launch Triton kernel '",
              opreg::detail::escaped(name_), "': ", why);
  Variant* variant = select(kernel, args, call.device, &why);
  TORCH_CHECK(variant != nullptr, "opreg: cannot launch Triton kernel '",
              opreg::detail::escaped(name_), "' on cuda:", call.device, ": ", why);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;

  // 2. Device, context, stream, module.
  const auto* d = cuda::driver();
  c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(call.device));
  // Note [A device guard only where the device is not current]: restoring the device at the end
  // of a guard costs a driver query on CUDA (PyTorch's MaybeSetDevice asks whether the device has
  // a primary context) on every call, even when nothing changed; inside an op's call, whose
  // trampoline made the device current, nothing needs changing. The driver says which device's
  // context is current: PyTorch's own current device can name another one (a thread-local target
  // it sets when it restores a device that has no context yet).
  const c10::impl::DeviceGuardImplInterface* cuda_guard =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  cuda::CUcontext current = nullptr;
  cuda::CUdevice current_device = -1;
  const bool on_device = d->cuCtxGetCurrent(&current) == 0 && current != nullptr &&
                         d->cuCtxGetDevice(&current_device) == 0 && current_device == call.device;
  c10::OptionalDeviceGuard guard;
  if (!on_device) guard.reset_device(device);
  cuda::make_context_current(*d, call.device);
  auto stream = static_cast<cuda::CUstream>(cuda_guard->getStream(device).native_handle());
  cuda::CUfunction function = function_on(kernel, *variant, *d, call.device);

  // 3. Parameters: every non-constant argument, then the global and profile scratch pointers.
  PackedParams params;
  const Arg* argv = args.data();
  for (size_t i = 0; i < kernel.params.size(); ++i) {
    if (variant->dropped[i]) continue;
    pack(kernel.params[i], argv[i], params.next(), name_);
  }
  // grid.x * grid.y * grid.z < 2^63 by the limits above; times num_ctas (<= 16) may not be.
  int64_t programs = 0;
  TORCH_CHECK_VALUE(
      !c10::mul_overflows(grid.x * grid.y * grid.z, int64_t{variant->num_ctas}, &programs) &&
          grid.x * variant->num_ctas < (int64_t{1} << 31),
      "opreg: Triton kernel '", opreg::detail::escaped(name_), "': grid (", grid.x, ", ", grid.y,
      ", ", grid.z, ") times ", variant->num_ctas,
      " CTAs per program is outside CUDA's limits (x < 2^31)");
  at::Tensor global_scratch, profile_scratch;
  void* global_pointer = nullptr;
  void* profile_pointer = nullptr;
  if (variant->global_scratch_size > 0) {
    global_scratch = scratch(name_, variant->global_scratch_size, variant->global_scratch_align,
                             programs, *call.first_tensor);
    global_pointer = aligned_pointer(global_scratch, variant->global_scratch_align);
  }
  if (variant->profile_scratch_size > 0) {
    profile_scratch = scratch(name_, variant->profile_scratch_size, variant->profile_scratch_align,
                              programs, *call.first_tensor);
    profile_pointer = aligned_pointer(profile_scratch, variant->profile_scratch_align);
  }
  pack_pointer(global_pointer, params.next());
  pack_pointer(profile_pointer, params.next());

  // 4. Launch.
  LaunchShape shape;
  shape.grid_x = static_cast<unsigned>(grid.x);
  shape.grid_y = static_cast<unsigned>(grid.y);
  shape.grid_z = static_cast<unsigned>(grid.z);
  shape.block = static_cast<unsigned>(32 * variant->num_warps);
  shape.shared = static_cast<unsigned>(variant->shared);
  shape.num_ctas = static_cast<unsigned>(variant->num_ctas);
  shape.pdl = variant->launch_pdl;
  shape.cooperative = variant->launch_cooperative_grid;
  const cuda::CUresult result = launch_kernel(*d, function, shape, stream, params.data());
  TORCH_CHECK(result == cuda::kSuccess, "opreg: launching Triton kernel '",
              opreg::detail::escaped(name_), "' (sm_", variant->arch, ", ",
              variant->assumptions_text, ") with grid (", grid.x, ", ", grid.y, ", ", grid.z,
              ") on cuda:", call.device, " failed: ", cuda::error_text(result));
}

// Runs while a library loads (the generated source's static initializer), where an exception
// would abort the process: a bundle that fails is recorded and reported when its kernel is used
// (and warned about now), so ops fall back instead.
bool register_embedded_bundle(const char* manifest, size_t manifest_size, const EmbeddedFile* files,
                              size_t num_files) {
  if (detail::loading_library()) detail::record_load_caller(__builtin_return_address(0));
  const std::string text = manifest != nullptr ? std::string(manifest, manifest_size) : "";
  try {
    TORCH_CHECK_VALUE(files != nullptr || num_files == 0,
                      "opreg: embedded Triton bundle: ", num_files,
                      " files given as a null pointer");
    for (size_t i = 0; i < num_files; ++i) {
      TORCH_CHECK_VALUE(files[i].name != nullptr, "opreg: embedded Triton bundle: file ", i,
                        " has no name (a null pointer)");
      TORCH_CHECK_VALUE(files[i].data != nullptr || files[i].size == 0,
                        "opreg: embedded Triton bundle: file '", escaped(files[i].name),
                        "' has no data (a null pointer) for its ", files[i].size, " bytes");
    }
    std::vector<std::unique_ptr<KernelImpl>> kernels;
    kernels.push_back(parse_manifest(text, "(embedded)", [&](const std::string& name) {
      for (size_t i = 0; i < num_files; ++i) {
        if (name == files[i].name) {
          return std::string(reinterpret_cast<const char*>(files[i].data), files[i].size);
        }
      }
      TORCH_CHECK_VALUE(false, "opreg: embedded Triton bundle lacks the binary '", name, "'");
    }));
    if (detail::loading_library()) {
      stage_kernel(std::move(kernels.front()), "embedded Triton bundle");
    } else {
      add_kernels(std::move(kernels), {"embedded Triton bundle"});
    }
    return true;
  } catch (const std::exception& error) {
    std::string name;
    auto parsed = json_nesting(text) <= kMaxManifestNesting
                      ? nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false)
                      : nlohmann::json();
    if (parsed.is_object() && parsed.contains("kernel") && parsed["kernel"].is_string()) {
      name = parsed["kernel"].get<std::string>();
    }
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    const std::string message = c10_error ? c10_error->what_without_backtrace() : error.what();
    const bool loading = detail::loading_library();
    bool another_of_the_name = false;
    {
      auto& reg = registry();
      std::lock_guard<std::mutex> lock(reg.mutex);
      auto found = reg.kernels.find(name);
      another_of_the_name = found != reg.kernels.end();
      if (another_of_the_name && !loading) {
        // Kernels are found by name: this library's ops would launch the registered kernel,
        // built for other launches, and nothing here can be rolled back. Every op of the name
        // falls back instead (the kernels the library's code looks up are not told apart).
        found->second->clashed.store(true, std::memory_order_relaxed);
        reg.failures.insert_or_assign(
            name, message + "; a library opened outside opreg.load_library embeds it, so " +
                      "neither kernel of the name is launched (opreg.load_library refuses such " +
                      "a library)");
      } else {
        reg.failures.emplace(name, message);
      }
    }
    another_of_the_name = another_of_the_name || staged_kernel(name) != nullptr;
    // Inside opreg::load_library the library fails (and its ops are rolled back).
    if (another_of_the_name && loading) {
      detail::record_load_failure("Triton kernel '" + name + "'", message);
      return false;
    }
    TORCH_WARN("opreg: the embedded Triton kernel '", name, "' was not registered: ", message);
    return false;
  }
}

// The manifest file names index.txt lists, one a line: blank lines, surrounding spaces, CRLF
// line ends and a UTF-8 byte order mark are tolerated (an editor may add them); a control byte
// means the file is not a text list, and the error says where.
std::vector<std::pair<std::string, size_t>> index_entries(const std::string& text,
                                                          const std::string& index_path) {
  std::vector<std::pair<std::string, size_t>> entries;
  const size_t bom = text.compare(0, 3, "\xef\xbb\xbf") == 0 ? 3 : 0;
  std::istringstream lines(text.substr(bom));
  size_t number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    line = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
    const auto control = std::find_if(line.begin(), line.end(), [](char c) {
      const auto byte = static_cast<unsigned char>(c);
      return byte < 0x20 || byte == 0x7f;
    });
    TORCH_CHECK_VALUE(control == line.end(), "opreg: ", escaped(index_path), " line ", number,
                      " has the control byte ", escaped(std::string(1, *control)),
                      ": index.txt must list the file names of the manifests beside it, one a "
                      "line; is it the index.txt written by python -m opreg.aot?");
    TORCH_CHECK_VALUE(is_plain_file_name(line), "opreg: ", escaped(index_path), " line ", number,
                      ": expected the file name of a manifest beside it, got '", escaped(line),
                      "'");
    for (const auto& [earlier, earlier_number] : entries) {
      TORCH_CHECK_VALUE(earlier != line, "opreg: ", escaped(index_path), " line ", number,
                        " lists '", escaped(line), "' again (line ", earlier_number,
                        "): each manifest is listed once");
    }
    entries.emplace_back(line, number);
  }
  return entries;
}

// Reads and checks every manifest and binary of the folder before registering any: a folder with
// one bad manifest registers nothing.
namespace {

std::vector<std::string> load_bundle_dir_now(const std::string& path) {
  // "" would name /index.txt.
  TORCH_CHECK_VALUE(!path.empty(),
                    "opreg::triton::load_bundle_dir: 'path' is empty; pass the folder that "
                    "python -m opreg.aot wrote");
  const auto index_path = path + "/index.txt";
  std::error_code error;
  TORCH_CHECK_VALUE(std::filesystem::exists(index_path, error), "opreg: ", escaped(path),
                    " has no index.txt; is it a folder written by python -m opreg.aot?");
  std::vector<std::unique_ptr<KernelImpl>> kernels;
  std::vector<std::string> origins, names;
  for (const auto& [manifest, line] : index_entries(read_bundle_file(index_path, ""), index_path)) {
    const auto manifest_path = path + "/" + manifest;
    const auto text =
        read_bundle_file(manifest_path, "listed in index.txt line " + std::to_string(line));
    auto read_binary = [&](const std::string& name) {
      return read_bundle_file(path + "/" + name, "named by " + escaped(manifest_path));
    };
    origins.push_back("Triton manifest " + escaped(manifest_path));
    kernels.push_back(parse_manifest(text, escaped(manifest_path), read_binary));
    names.push_back(kernels.back()->name);
  }
  add_kernels(std::move(kernels), origins);
  return names;
}

}  // namespace

std::vector<std::string> load_bundle_dir(const std::string& path) {
  // A library's static initializer may load its kernels: inside a load, an error fails the load.
  return detail::or_fail_the_load<std::vector<std::string>>(
      path, __builtin_return_address(0), [&] { return load_bundle_dir_now(path); });
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
