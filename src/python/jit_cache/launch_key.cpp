// src/python/jit_cache/launch_key.cpp: the specialization key of a Triton JIT launch (see the
// header).
#include "launch_key.h"

#include <torch/csrc/autograd/python_variable.h>

#include <climits>

namespace opreg::python {
namespace {

namespace py = pybind11;

enum Tag : char {
  kTensor = 'T',
  kBool = 'B',
  kInt = 'I',
  kFloat = 'F',
  kNone = 'N',
  kValue = 'V',
  kKeyword = 'K',
  kSalt = 'S',
};

template <class T>
void append_raw(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

bool append_text(std::string& key, PyObject* text) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text, &size);
  if (data == nullptr) {
    PyErr_Clear();
    return false;
  }
  append_raw(key, static_cast<int64_t>(size));
  key.append(data, size);
  return true;
}

// A tensor, as Triton specializes a pointer: dtype and 16-byte alignment.
void append_tensor(std::string& key, PyObject* object) {
  const auto& tensor = THPVariable_Unpack(object);
  key.push_back(kTensor);
  key.push_back(static_cast<char>(tensor.scalar_type()));
  key.push_back(reinterpret_cast<uintptr_t>(tensor.data_ptr()) % 16 == 0 ? 1 : 0);
}

// A runtime argument: its type and what Triton specializes it on (for integers: 32 or 64 bits,
// == 1, divisible by 16). False when the key does not cover its type.
bool append_argument(std::string& key, PyObject* object) {
  if (THPVariable_Check(object)) {
    append_tensor(key, object);
    return true;
  }
  if (PyBool_Check(object)) {
    key.push_back(kBool);
    key.push_back(object == Py_True ? 1 : 0);
    return true;
  }
  if (PyLong_CheckExact(object)) {
    int overflow = 0;
    const long long number = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (overflow != 0) return false;  // beyond 64 bits: Triton's to judge
    const bool narrow = number >= INT32_MIN && number <= INT32_MAX;
    key.push_back(kInt);
    key.push_back(
        static_cast<char>((narrow ? 4 : 0) | (number == 1 ? 2 : 0) | (number % 16 == 0 ? 1 : 0)));
    return true;
  }
  if (PyFloat_CheckExact(object)) {
    key.push_back(kFloat);
    return true;
  }
  if (object == Py_None) {
    key.push_back(kNone);
    return true;
  }
  return false;
}

// A constexpr or an option: by type and value, so that 1, 1.0 and True differ.
bool append_value(std::string& key, PyObject* object) {
  if (THPVariable_Check(object)) {
    append_tensor(key, object);
    return true;
  }
  key.push_back(kValue);
  if (PyBool_Check(object)) {
    key.push_back('b');
    key.push_back(object == Py_True ? 1 : 0);
    return true;
  }
  if (PyLong_CheckExact(object)) {
    int overflow = 0;
    const long long number = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (overflow != 0) return false;
    key.push_back('i');
    append_raw(key, number);
    return true;
  }
  if (PyFloat_CheckExact(object)) {
    key.push_back('f');
    append_raw(key, PyFloat_AS_DOUBLE(object));
    return true;
  }
  if (PyUnicode_CheckExact(object)) {
    key.push_back('s');
    return append_text(key, object);
  }
  if (object == Py_None) {
    key.push_back('n');
    return true;
  }
  return false;
}

}  // namespace

bool launch_key(const LaunchKeyContext& context, PyObject* args, PyObject* kwargs,
                std::string* key) {
  key->clear();
  append_raw(*key, context.device);
  const Py_ssize_t num_args = PyTuple_GET_SIZE(args);
  for (Py_ssize_t i = 0; i < num_args; ++i) {
    PyObject* value = PyTuple_GET_ITEM(args, i);
    const bool by_value =
        static_cast<size_t>(i) < context.constexpr_params->size() && (*context.constexpr_params)[i];
    if (!(by_value ? append_value(*key, value) : append_argument(*key, value))) return false;
  }
  if (kwargs != nullptr) {
    static PyObject* const grid = PyUnicode_InternFromString("grid");
    static PyObject* const warmup = PyUnicode_InternFromString("warmup");
    Py_ssize_t position = 0;
    PyObject *name, *value;
    while (PyDict_Next(kwargs, &position, &name, &value)) {
      if (name == grid || name == warmup) continue;
      key->push_back(kKeyword);
      if (!PyUnicode_Check(name) || !append_text(*key, name)) return false;
      PyObject* constexpr_flag = PyDict_GetItemWithError(context.constexpr_by_name, name);
      if (constexpr_flag == nullptr && PyErr_Occurred()) throw py::error_already_set();
      const bool runtime_param = constexpr_flag == Py_False;  // options and constexprs: by value
      if (!(runtime_param ? append_argument(*key, value) : append_value(*key, value))) return false;
    }
  }
  key->push_back(kSalt);
  key->push_back(context.debug ? 1 : 0);
  return PyUnicode_Check(context.instrumentation_mode) &&
         append_text(*key, context.instrumentation_mode);
}

}  // namespace opreg::python
