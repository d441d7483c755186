// src/python/module.cpp: the extension module opreg._C, which exposes the C++ core's registry,
// device types, trace, the AOT Triton launcher and Python-defined ops to the Python package.
#include <algorithm>
#include <optional>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include "jit_cache/jit_cache.h"
#include "opreg/opreg.h"
#include "opreg/triton.h"
#include "python_op.h"

namespace py = pybind11;

namespace {

// One Python `opreg.trace()` block: an open TraceScope until close(), then its records, frozen.
class TraceBlock {
 public:
  TraceBlock() { scope_.emplace(); }
  std::vector<opreg::TraceRecord> records() const { return scope_ ? scope_->records() : frozen_; }
  void close() {
    if (!scope_) return;
    frozen_ = scope_->records();
    scope_.reset();
  }

 private:
  std::optional<opreg::TraceScope> scope_;
  std::vector<opreg::TraceRecord> frozen_;
};

// Python arguments of a kernel launch; keeps the tensors alive while the Args point at them.
struct LaunchArgs {
  std::vector<at::Tensor> tensors;
  std::vector<opreg::triton::Arg> args;

  LaunchArgs(const std::string& kernel, const py::args& values) {
    tensors.reserve(values.size());
    args.reserve(values.size());
    for (const auto& value : values) {
      if (THPVariable_Check(value.ptr())) {
        tensors.push_back(THPVariable_Unpack(value.ptr()));
        args.emplace_back(tensors.back());
      } else if (py::isinstance<py::bool_>(value) || py::isinstance<py::int_>(value)) {
        args.emplace_back(value.cast<int64_t>());
      } else if (py::isinstance<py::float_>(value)) {
        args.emplace_back(value.cast<double>());
      } else {
        TORCH_CHECK_TYPE(false, "opreg: kernel '", kernel, "': argument ", args.size(), " is a ",
                         py::str(value.get_type()).cast<std::string>(),
                         "; expected a tensor, an int or a float");
      }
    }
  }
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "opreg's C++ core (private: use the opreg package)";
  m.attr("version") = OPREG_VERSION_STRING;

  py::class_<opreg::OpFlags>(m, "OpFlags").def("as_dict", [](const opreg::OpFlags& flags) {
    py::dict values;
#define OPREG_FLAG_ITEM(flag, promise) values[#flag] = flags.flag;
    OPREG_OP_FLAGS(OPREG_FLAG_ITEM)
#undef OPREG_FLAG_ITEM
    return values;
  });
  py::class_<opreg::DeviceServing> serving(m, "DeviceServing");
  py::enum_<opreg::DeviceServing::Kind>(serving, "Kind")
      .value("KERNEL", opreg::DeviceServing::Kind::kKernel)
      .value("SKIPPED", opreg::DeviceServing::Kind::kSkipped);
  serving.def_readonly("device_type", &opreg::DeviceServing::device_type)
      .def_readonly("kind", &opreg::DeviceServing::kind)
      .def_readonly("kernel", &opreg::DeviceServing::kernel)
      .def_readonly("reason", &opreg::DeviceServing::reason)
      .def("describe", [](const opreg::DeviceServing& s) { return opreg::describe(s); });
  py::enum_<opreg::FakeSource>(m, "FakeSource")
      .value("EXPLICIT", opreg::FakeSource::kExplicit)
      .value("PYTHON", opreg::FakeSource::kPython)
      .value("FALLBACK_ON_META", opreg::FakeSource::kFallbackOnMeta);
  py::enum_<opreg::AutogradSupport>(m, "AutogradSupport")
      .value("BACKWARD", opreg::AutogradSupport::kBackward)
      .value("FALLBACK", opreg::AutogradSupport::kFallback)
      .value("ERROR", opreg::AutogradSupport::kError)
      .value("NONE", opreg::AutogradSupport::kNone);
  py::enum_<opreg::VmapSupport>(m, "VmapSupport")
      .value("RULE", opreg::VmapSupport::kRule)
      .value("BATCH_POLYMORPHIC", opreg::VmapSupport::kBatchPolymorphic)
      .value("FALLBACK", opreg::VmapSupport::kFallback)
      .value("PER_EXAMPLE_LOOP", opreg::VmapSupport::kPerExampleLoop);
  m.def("describe_fake", py::overload_cast<opreg::FakeSource>(&opreg::describe));
  m.def("describe_autograd", py::overload_cast<opreg::AutogradSupport>(&opreg::describe));
  m.def("describe_vmap", py::overload_cast<opreg::VmapSupport>(&opreg::describe));
  py::class_<opreg::OpReport>(m, "OpReport")
      .def_readonly("name", &opreg::OpReport::name)
      .def_readonly("schema", &opreg::OpReport::schema)
      .def_readonly("origin", &opreg::OpReport::origin)
      .def_readonly("kernels", &opreg::OpReport::kernels)
      .def_readonly("fake", &opreg::OpReport::fake)
      .def_readonly("autograd", &opreg::OpReport::autograd)
      .def_readonly("vmap", &opreg::OpReport::vmap)
      .def_readonly("flags", &opreg::OpReport::flags)
      .def_readonly("dtypes", &opreg::OpReport::dtypes)
      .def("describe", [](const opreg::OpReport& r) { return opreg::describe(r); });
  m.def("describe_ops", &opreg::describe_ops);
  m.def("describe_op", &opreg::describe_op, py::arg("name"));
  m.def("load_library", &opreg::load_library, py::arg("path"));

  m.def("accelerated_device_types", &opreg::accelerated_device_types);
  m.def("register_accelerated_device_type", &opreg::register_accelerated_device_type,
        py::arg("name"));

  // Triton AOT kernels, launched through the C++ launcher.
  py::class_<opreg::triton::Kernel>(m, "TritonKernel")
      .def(py::init<std::string>(), py::arg("name"))
      .def_property_readonly("name", &opreg::triton::Kernel::name)
      .def("available_on",
           [](const opreg::triton::Kernel& kernel, int device) {
             std::string why;
             bool ok = kernel.available_on(device, &why);
             return py::make_tuple(ok, why);
           })
      .def("variant_for",
           [](const opreg::triton::Kernel& kernel, const py::args& args) {
             LaunchArgs launch_args(kernel.name(), args);
             return kernel.variant_for(launch_args.args);
           })
      .def("launch", [](const opreg::triton::Kernel& kernel, const std::vector<int64_t>& grid,
                        const py::args& args) {
        TORCH_CHECK_VALUE(!grid.empty() && grid.size() <= 3, "opreg: kernel '", kernel.name(),
                          "': the grid has 1 to 3 dimensions, got ", grid.size());
        LaunchArgs launch_args(kernel.name(), args);
        opreg::triton::Grid g(grid[0], grid.size() > 1 ? grid[1] : 1,
                              grid.size() > 2 ? grid[2] : 1);
        kernel.launch(g, launch_args.args);
      });
  m.def("triton_load_bundle_dir", &opreg::triton::load_bundle_dir, py::arg("path"));
  m.def("triton_driver_available", [] {
    std::string why;
    bool ok = opreg::triton::driver_available(&why);
    return py::make_tuple(ok, why);
  });
  m.def("triton_describe_kernels", [] {
    py::list kernels;
    for (const auto& k : opreg::triton::describe_kernels()) {
      py::list variants;
      for (const auto& v : k.variants) {
        variants.append(py::dict(py::arg("arch") = v.arch, py::arg("assumptions") = v.assumptions,
                                 py::arg("config") = v.config, py::arg("shared") = v.shared));
      }
      kernels.append(py::dict(py::arg("name") = k.name, py::arg("source") = k.source,
                              py::arg("params") = k.params, py::arg("variants") = variants));
    }
    return kernels;
  });

  // Ops defined from Python, through the same core.
  py::class_<opreg::AutogradContext>(m, "AutogradContext")
      .def("save_for_backward",
           [](opreg::AutogradContext& ctx, const std::vector<at::Tensor>& tensors) {
             ctx.save_for_backward(tensors);
           })
      .def_property_readonly("saved_tensors", &opreg::AutogradContext::saved_tensors)
      .def("needs_input_grad", &opreg::AutogradContext::needs_input_grad)
      .def_property_readonly("num_inputs", &opreg::AutogradContext::num_inputs);
  py::class_<opreg::AotLaunch>(m, "AotLaunch")
      .def(py::init([](std::string kernel, std::vector<std::string> grid,
                       std::vector<std::string> arguments, std::string outputs) {
             return opreg::AotLaunch{std::move(kernel), std::move(grid), std::move(arguments),
                                     std::move(outputs)};
           }),
           py::arg("kernel"), py::arg("grid"), py::arg("arguments"), py::arg("outputs") = "fake")
      .def_readonly("kernel", &opreg::AotLaunch::kernel)
      .def_readonly("grid", &opreg::AotLaunch::grid)
      .def_readonly("arguments", &opreg::AotLaunch::arguments)
      .def_readonly("outputs", &opreg::AotLaunch::outputs)
      .def("__repr__", [](const opreg::AotLaunch& launch) {
        return "AotLaunch(kernel='" + launch.kernel + "', outputs='" + launch.outputs + "')";
      });
  opreg::python::bind_op_builder(m);
  opreg::python::bind_jit_cache(m);

  // The fallback alone, bypassing kernels: for opreg.opcheck.
  m.def("call_fallback", [](const std::string& name, const py::list& args, const py::dict& kwargs) {
    const auto& schema = opreg::find_operator(name).schema();
    const auto& arguments = schema.arguments();
    TORCH_CHECK_TYPE(args.size() <= arguments.size(), name, ": ", args.size(),
                     " positional arguments given, the schema takes ", arguments.size());
    for (const auto& [key, value] : kwargs) {
      const auto keyword = py::str(key).cast<std::string>();
      TORCH_CHECK_TYPE(
          std::any_of(arguments.begin() + args.size(), arguments.end(),
                      [&](const auto& argument) { return argument.name() == keyword; }),
          name, ": unexpected keyword argument '", keyword, "'");
    }
    std::vector<c10::IValue> stack;
    auto convert = [&](const py::handle& value, const c10::Argument& argument) {
      try {
        return torch::jit::toIValue(value, argument.type());
      } catch (const std::exception&) {
        TORCH_CHECK_TYPE(false, name, ": argument '", argument.name(), "' is a ",
                         py::str(value.get_type()).cast<std::string>(), ", expected ",
                         argument.real_type()->str());
      }
    };
    for (size_t i = 0; i < arguments.size(); ++i) {
      const auto& argument = arguments[i];
      if (i < args.size()) {
        stack.push_back(convert(args[i], argument));
      } else if (kwargs.contains(argument.name())) {
        stack.push_back(convert(kwargs[py::str(argument.name())], argument));
      } else {
        TORCH_CHECK_VALUE(argument.default_value().has_value(), name, ": argument '",
                          argument.name(), "' is missing");
        stack.push_back(*argument.default_value());
      }
    }
    std::vector<c10::IValue> outputs;
    {
      py::gil_scoped_release no_gil;
      outputs = opreg::testing::call_fallback(name, std::move(stack));
    }
    py::list result;
    for (auto& output : outputs) result.append(torch::jit::toPyObject(std::move(output)));
    return result;
  });

  py::class_<TraceBlock>(m, "TraceScope")
      .def(py::init<>())
      .def("records",
           [](const TraceBlock& block) {
             py::list records;
             for (const auto& record : block.records()) {
               records.append(py::make_tuple(record.op, record.impl, record.device));
             }
             return records;
           })
      .def("close", &TraceBlock::close);

  // kernel_vs_fallback's (atol, rtol) for a dtype: opreg.opcheck applies the C++ rule.
  m.def("testing_tolerance", [](at::ScalarType dtype) {
    const auto tolerance = opreg::testing::tolerance(dtype);
    return py::make_tuple(tolerance.atol, tolerance.rtol);
  });
}
