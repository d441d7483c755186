// include/opreg/triton.h: launching ahead-of-time compiled Triton kernels from C++.
//
//   static const opreg::triton::Kernel add_kernel("opreg_fused_add_f32");
//   ...
//   add_kernel.launch({cdiv(n, 1024)}, {x, y, out, n});  // on x's device, current stream
//
// Binaries come from `python -m opreg.aot` (python/opreg/aot/compile.py): embedded into a library
// by the generated C++ source, or loaded from a folder with load_bundle_dir(). CUDA is reached
// through the driver library opened at run time: nothing here needs CUDA to build, link, or to
// run on machines without it (kernels then decline, and ops fall back).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include "opreg/aot_launch.h"
#include "opreg/definition.h"
#include "opreg/export.h"

namespace opreg::triton {

// One argument of a launch, in the kernel's declaration order (constexpr arguments excluded).
class OPREG_API Arg {
 public:
  enum class Kind : uint8_t { kTensor, kInt, kFloat, kPointer };
  Arg(const at::Tensor& tensor) : kind_(Kind::kTensor), tensor_(&tensor) {}  // NOLINT
  Arg(int64_t value) : kind_(Kind::kInt), int_(value) {}                     // NOLINT
  Arg(int value) : kind_(Kind::kInt), int_(value) {}                         // NOLINT
  Arg(double value) : kind_(Kind::kFloat), float_(value) {}                  // NOLINT
  Arg(float value) : kind_(Kind::kFloat), float_(value) {}                   // NOLINT
  Arg(const void* pointer) : kind_(Kind::kPointer), pointer_(pointer) {}     // NOLINT

  Kind kind() const { return kind_; }
  const at::Tensor& tensor() const { return *tensor_; }
  int64_t as_int() const { return int_; }
  double as_float() const { return float_; }
  const void* pointer() const;

 private:
  Kind kind_;
  union {
    const at::Tensor* tensor_;
    int64_t int_;
    double float_;
    const void* pointer_;
  };
};

struct Grid {
  Grid(int64_t x_ = 1, int64_t y_ = 1, int64_t z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT
  int64_t x, y, z;
};

// ceil(a / b) for b > 0, without forming a + b - 1 (which overflows for a near INT64_MAX).
inline int64_t cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0 && a > 0 ? 1 : 0); }

struct KernelImpl;  // the kernel's variants and per-device modules (src/triton/)

// One parameter of a kernel, as its manifest declares it.
struct Parameter {
  std::string name;
  std::string type;  // as Triton spells it: "*fp32" (a pointer), "i64", "fp32"
  bool is_pointer() const { return !type.empty() && type[0] == '*'; }
};

class OPREG_API Kernel {
 public:
  explicit Kernel(std::string name);
  const std::string& name() const { return name_; }

  // Whether a variant fits these arguments on the device of the first tensor argument (its
  // binary exists for the device's compute capability and its assumptions hold). When false,
  // `why_not` (if given) says why: the op's fallback should serve the call.
  bool can_launch(c10::ArrayRef<Arg> args, std::string* why_not = nullptr) const;

  // Whether a binary exists for the compute capability of CUDA device `device` and the driver can
  // be opened: cheap (cached per device). Alignment and divisibility never make a launch fail,
  // since every kernel also has a generic variant.
  bool available_on(int device, std::string* why_not = nullptr) const;

  // The parameters a launch passes, in order; nullopt while no binaries are registered for it.
  std::optional<std::vector<Parameter>> parameters() const;

  // The variant a launch with these arguments would use ("sm_90 [x:aligned16, n:div16]"), or
  // why none fits: for tests and debugging.
  std::string variant_for(c10::ArrayRef<Arg> args) const;

  // Launches on the current stream of the first tensor argument's device. Raises an error naming
  // the kernel, the grid and the CUDA error when the launch fails, or when no variant fits.
  void launch(Grid grid, c10::ArrayRef<Arg> args) const;

 private:
  KernelImpl* find() const;
  KernelImpl& impl() const;
  std::string name_;
  mutable std::atomic<KernelImpl*> impl_{nullptr};
  mutable std::array<std::atomic<uint8_t>, 64> availability_{};
};

// What the generated C++ source registers: the manifest and its binaries.
struct EmbeddedFile {
  const char* name;
  const unsigned char* data;
  size_t size;
};
OPREG_API bool register_embedded_bundle(const char* manifest, size_t manifest_size,
                                        const EmbeddedFile* files, size_t num_files);

// Loads every manifest (*.json) of a folder written by `python -m opreg.aot`. Returns the names
// of the kernels it registered.
OPREG_API std::vector<std::string> load_bundle_dir(const std::string& path);

struct VariantReport {
  int arch;
  std::string assumptions;  // "x:aligned16, n:div16" or "generic"
  std::string config;       // "num_warps=4 num_stages=3"
  int64_t shared;
};
struct KernelReport {
  std::string name;
  std::string source;
  std::vector<std::string> params;
  std::vector<VariantReport> variants;
};
OPREG_API std::vector<KernelReport> describe_kernels();

// An AOT-compiled kernel attached to an op by declaration (see opreg/aot_launch.h), as a kernel
// like any other: .kernel(opreg::triton::aot(launch), opreg::on({"cuda"}).name("triton")).
OPREG_API KernelFactory aot(AotLaunch launch);

// Whether the CUDA driver could be opened, and if not, why.
OPREG_API bool driver_available(std::string* why_not = nullptr);

}  // namespace opreg::triton
