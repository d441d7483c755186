// include/opreg/definition.h: the one path from a declaration to an op. An OpBuilder takes every
// piece of an op as a boxed kernel factory and every switch as a flag; the typed C++ builder
// (opreg/op.h) and the Python front (opreg._C.OpBuilder) both fill one, and define() turns it
// into the op's immutable definition (Note [Definitions are immutable], src/core/registry.cpp).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/function_schema.h>
#include <c10/core/ScalarType.h>

#include "opreg/autograd.h"
#include "opreg/export.h"
#include "opreg/version.h"
#include "opreg/vmap.h"

namespace opreg {

namespace detail {
struct PythonFront;  // src/python/python_op.cpp: what only the Python front may set
}  // namespace detail

// The op-wide switches of a declaration: X(name, what it promises). Each one is a method of the
// C++ builders (`.bitwise()`), a keyword of the Python front (`bitwise=True`) and a field of
// OpReport::flags; nothing else lists them.
#define OPREG_OP_FLAGS(X)                                                                    \
  X(bitwise, "its kernels give results bitwise equal to the fallback's (opcheck checks it)") \
  X(allow_mixed_devices,                                                                     \
    "its kernels take tensor arguments on several devices (else the fallback serves those)") \
  X(batch_polymorphic,                                                                       \
    "it accepts extra leading dimensions on every tensor argument: vmap calls it once")      \
  X(vmap_per_example_loop,                                                                   \
    "vmap loops over the examples (only for ops whose output shapes depend on the data)")    \
  X(random, "it draws random numbers: torch.vmap's randomness argument applies to it")       \
  X(cuda_graph_unsafe,                                                                       \
    "a CUDA graph cannot capture it (a host side effect or synchronisation): it is tagged "  \
    "torch.Tag.cudagraph_unsafe, so torch.compile's CUDA graphs leave it out")

// How DTensor (torch.distributed.tensor) runs the op on sharded tensors. The strategy is registered
// from Python (python/opreg/_dtensor.py) once torch.distributed.tensor is imported; C++ records it.
//   kNone:      no strategy: DTensor refuses calls on DTensors (an error naming the op).
//   kReplicate: inputs are gathered (replicated) and every rank computes the whole output.
//   kPointwise: elementwise: any shard of the broadcast output is computed from the same shard of
//               the inputs (inputs broadcast along a dim are replicated), so nothing is gathered.
//   kPython:    a strategy function given to the Python front (torch's register_sharding form).
// Without a declaration: kNone. kPointwise needs Tensor and scalar arguments and Tensor outputs,
// nothing mutated; it is declared, never assumed from batch_polymorphic (which does not mean
// elementwise: a row softmax is batch-polymorphic, and pointwise would shard its rows' dim).
enum class Sharding { kNone, kReplicate, kPointwise, kPython };

struct OpFlags {
#define OPREG_FLAG_FIELD(flag, promise) bool flag = false;
  OPREG_OP_FLAGS(OPREG_FLAG_FIELD)
#undef OPREG_FLAG_FIELD
};

// Every flag's name and promise, in declaration order (for the Python front and reports).
OPREG_API const std::vector<std::pair<std::string, std::string>>& op_flag_names();

// What a kernel factory is given when an op is defined: the op's name and schema, the label its
// trace records use ("kernel:<name>", "fallback", "fake"), and the op's fallback, boxed, with the
// argument and output checks (null when the fallback itself is being built). op, schema and
// label live as long as the definition: the piece made may keep them. A fallback kept past its
// definition (a replace, an undefine) raises an error naming the op when called.
struct KernelContext {
  const std::string& op;
  const c10::FunctionSchema& schema;
  const std::string& label;
  std::shared_ptr<const c10::KernelFunction> fallback;
};

// Builds one piece of an op (its fallback, a kernel, its fake) for one definition: a typed C++
// callable, a Python function or an AOT Triton launch (opreg::triton::aot) made boxed. The
// KernelFunction must take the schema's arguments: opreg cannot read the C++ signature of one made
// by hand (a call then meets PyTorch's "expected int"); opreg::op's pieces are checked.
struct KernelFactory {
  std::function<c10::KernelFunction(const KernelContext&)> make;
};

// The opreg headers an op library was compiled with. It is a default argument of define(), so it
// is evaluated in the library that declares the op: libopreg refuses a library built against
// headers of another minor version (an error naming both), instead of misreading its builder.
struct AbiTag {
  int major = OPREG_VERSION_MAJOR;
  int minor = OPREG_VERSION_MINOR;
  int patch = OPREG_VERSION_PATCH;
  size_t factory_size = sizeof(KernelFactory);
  size_t context_size = sizeof(KernelContext);
};

class OpBuilder;

namespace detail {
// An op that define_all published, with its definition's serial (detail::definition_serial): the
// Python front records the definition's Python pieces under it.
struct Published {
  std::string name;
  uint64_t serial = 0;
};
OPREG_API std::vector<Published> define_all_published(std::vector<OpBuilder> builders, AbiTag abi);
}  // namespace detail

class OPREG_API OpBuilder {
 public:
  // "ns::name" (the schema then comes from infer_schema) or "ns::name(Tensor x) -> Tensor".
  explicit OpBuilder(std::string name_or_schema);
  ~OpBuilder();
  OpBuilder(OpBuilder&&) noexcept;
  OpBuilder& operator=(OpBuilder&&) noexcept;

  OpBuilder& infer_schema(std::function<c10::FunctionSchema()> infer);
  OpBuilder& fallback(KernelFactory factory);
  // The op's abstract evaluation on meta tensors. Without one, the fallback runs on meta tensors.
  OpBuilder& fake(KernelFactory factory);
  // `devices`: nullopt follows the accelerated device types (opreg/device_types.h).
  OpBuilder& kernel(KernelFactory factory, std::string name,
                    std::optional<std::vector<std::string>> devices);
  OpBuilder& dtypes(std::string argument, std::vector<c10::ScalarType> allowed);
  OpBuilder& flag(bool OpFlags::* flag, bool on = true);
  OpBuilder& flag(const std::string& name, bool on);  // define() refuses unknown names
  OpBuilder& backward(Backward backward, SetupContext setup_context);
  OpBuilder& autograd(AutogradPolicy policy);
  // The op's DTensor sharding (see Sharding); without it, the default described there.
  OpBuilder& sharding(Sharding sharding);
  OpBuilder& vmap(VmapRule rule);
  OpBuilder& replace(bool replace = true);
  // Replaces the op only while its definition is the one of `serial` (detail::definition_serial;
  // 0: only while it is not defined): a definition another thread made since is refused.
  OpBuilder& replace_only(uint64_t serial);
  OpBuilder& origin(std::string where);
  // The op serves `owner` (Python's vmap_fn companion `<owner>_vmap`): undefining `owner`
  // undefines it too.
  OpBuilder& part_of(std::string owner);
  // An address in the defining library: names it in reports and keeps it loaded.
  OpBuilder& caller(const void* address);

  // The name as declared ("ns::name"), for messages before the schema is parsed.
  std::string declared_name() const;

  // Validates everything, then publishes the op at once; a failure changes nothing.
  std::string define(AbiTag abi = {}) &&;

  struct State;  // src/core/spec.h

 private:
  friend OPREG_API std::vector<detail::Published> detail::define_all_published(
      std::vector<OpBuilder> builders, AbiTag abi);
  friend struct detail::PythonFront;
  // The fake is a Python function that opreg's Python front registers for FakeTensorMode, from
  // its module "opreg._declaration" (the only one taken); `meta` calls it on meta tensors. Not
  // public: from C++ it never took effect, and the op said it had a fake while its fallback
  // served meta calls (sweep 32 B-F3, sweep 33 B-F5).
  OpBuilder& python_fake(std::string python_module, KernelFactory meta);
  // How messages name the fallback: a vmap_fn companion's is the user's vmap_fn.
  OpBuilder& fallback_words(std::string words);
  // Declared from Python: messages spell its declarations as Python does (sharding="none").
  OpBuilder& declared_in_python();
  std::unique_ptr<State> state_;
};

// Defines several ops together: all of them, or (on any error) none.
OPREG_API std::vector<std::string> define_all(std::vector<OpBuilder> builders, AbiTag abi = {});

}  // namespace opreg
