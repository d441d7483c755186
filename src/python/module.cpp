// src/python/module.cpp: the extension module opreg._C, which exposes the C++ core's registry,
// device types and trace to the Python package.
#include <torch/csrc/utils/pybind.h>

#include "opreg/opreg.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "opreg's C++ core (private: use the opreg package)";

  py::class_<opreg::DeviceServing>(m, "DeviceServing")
      .def_readonly("device_type", &opreg::DeviceServing::device_type)
      .def_readonly("served_by", &opreg::DeviceServing::served_by);
  py::class_<opreg::OpReport>(m, "OpReport")
      .def_readonly("name", &opreg::OpReport::name)
      .def_readonly("schema", &opreg::OpReport::schema)
      .def_readonly("origin", &opreg::OpReport::origin)
      .def_readonly("kernels", &opreg::OpReport::kernels)
      .def_readonly("fake", &opreg::OpReport::fake)
      .def_readonly("autograd", &opreg::OpReport::autograd)
      .def_readonly("vmap", &opreg::OpReport::vmap);
  m.def("describe_ops", &opreg::describe_ops);
  m.def("describe_op", &opreg::describe_op, py::arg("name"));
  m.def("is_defined", &opreg::is_defined, py::arg("name"));
  m.def("undefine", &opreg::undefine, py::arg("name"));

  m.def("accelerated_device_types", &opreg::accelerated_device_types);
  m.def("register_accelerated_device_type", &opreg::register_accelerated_device_type,
        py::arg("name"));
  m.def("dispatch_key_for_device_type", [](const std::string& name) -> py::object {
    std::string why_not;
    auto key = opreg::dispatch_key_for_device_type(opreg::normalize_device_type(name), &why_not);
    if (key) return py::str(c10::toString(*key));
    return py::none();
  });

  m.def("set_trace_enabled", &opreg::set_trace_enabled, py::arg("enabled"));
  m.def("trace_records", [] {
    py::list records;
    for (const auto& record : opreg::trace_records()) {
      records.append(py::make_tuple(record.op, record.impl, record.device));
    }
    return records;
  });
}
