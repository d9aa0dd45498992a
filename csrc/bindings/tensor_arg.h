// Boundary checks on torch.Tensor arguments without compiling against libtorch: the tensor's own
// Python attributes (dtype, device, shape, is_contiguous, data_ptr) are read through pybind11, so
// the extension builds in seconds and does not depend on the torch C++ ABI. Header-only: every
// translation unit that includes pybind11 adds ~12 s to the build.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace freetoken::bindings {

namespace py = pybind11;

struct TensorArg {
  py::object obj;              // keeps the tensor alive while the kernel reads it
  std::vector<int64_t> shape;
  std::string dtype;           // torch dtype name without "torch.", e.g. "bfloat16"
  bool is_bf16 = false;        // dtype == "bfloat16"
  void* data = nullptr;
};

// "[8, 144, 200]"
inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// torch objects the checks compare against, looked up once (a Python import and attribute
// lookups per tensor cost more than the decode kernel's work on a small expert). NOTE:
// deliberately leaked, like the runner in bind_moe.cpp: nothing is released at interpreter exit.
struct TorchRefs {
  py::object tensor_type;
  py::object empty;    // torch.empty
  py::object float32;  // torch.float32
  std::vector<std::pair<py::object, std::string>> dtypes;  // dtype object -> name, e.g. "int64"
  // Interned attribute names (a name built from a C string each time is decoded and hashed).
  py::object is_cpu, dtype, shape, is_contiguous, data_ptr;
};

inline py::object interned(const char* name) {
  return py::reinterpret_steal<py::object>(PyUnicode_InternFromString(name));
}

// obj.name() with an interned name, without creating a bound method object.
inline py::object call_method(const py::handle& obj, const py::object& name) {
  PyObject* r = PyObject_CallMethodNoArgs(obj.ptr(), name.ptr());
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

inline const TorchRefs& torch_refs() {
  static const TorchRefs* refs = [] {
    auto* r = new TorchRefs;
    py::module_ torch = py::module_::import("torch");
    r->tensor_type = torch.attr("Tensor");
    r->empty = torch.attr("empty");
    r->float32 = torch.attr("float32");
    for (const char* name : {"float32", "bfloat16", "float16", "int64", "uint8", "float8_e4m3fn"}) {
      r->dtypes.emplace_back(torch.attr(name), name);
    }
    r->is_cpu = interned("is_cpu");
    r->dtype = interned("dtype");
    r->shape = interned("shape");
    r->is_contiguous = interned("is_contiguous");
    r->data_ptr = interned("data_ptr");
    return r;
  }();
  return *refs;
}

// torch dtype name without "torch.", e.g. "bfloat16".
inline std::string dtype_name(const py::handle& dtype) {
  for (const auto& [obj, name] : torch_refs().dtypes) {
    if (obj.is(dtype)) return name;
  }
  return py::str(dtype).cast<std::string>().substr(6);  // str(torch.bfloat16) == "torch.bfloat16"
}

// Checks that obj is a contiguous CPU torch.Tensor of rank `dim` whose dtype name (e.g.
// "float32", "bfloat16", "int64") is in `dtypes`. Raises TypeError for a non-tensor or a wrong
// dtype, ValueError for a wrong device, rank or layout; messages start with `name`.
inline TensorArg check_tensor(const py::handle& obj, const char* name, const char* layout,
                              int dim, const std::vector<std::string>& dtypes) {
  const TorchRefs& torch = torch_refs();
  if (!py::isinstance(obj, torch.tensor_type)) {
    throw py::type_error(std::string(name) + " must be a torch.Tensor, got " +
                         py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
  }
  if (!obj.attr(torch.is_cpu).cast<bool>()) {
    const std::string device = py::str(obj.attr("device")).cast<std::string>();
    throw py::value_error(std::string(name) + " must be a CPU tensor, got device " + device);
  }
  const std::string dtype = dtype_name(obj.attr(torch.dtype));
  bool dtype_ok = false;
  for (const auto& d : dtypes) dtype_ok = dtype_ok || d == dtype;
  if (!dtype_ok) {
    std::string allowed;
    for (const auto& d : dtypes) allowed += (allowed.empty() ? "" : " or ") + d;
    throw py::type_error(std::string(name) + " must be " + allowed + ", got " + dtype);
  }
  TensorArg arg;
  arg.obj = py::reinterpret_borrow<py::object>(obj);
  const py::tuple shape(obj.attr(torch.shape));  // torch.Size is a tuple
  for (const auto& d : shape) arg.shape.push_back(d.cast<int64_t>());
  if (static_cast<int>(arg.shape.size()) != dim) {
    throw py::value_error(std::string(name) + " must be " + std::to_string(dim) + "-D " + layout +
                          ", got shape " + shape_str(arg.shape));
  }
  if (!call_method(obj, torch.is_contiguous).cast<bool>()) {
    throw py::value_error(std::string(name) + " must be contiguous");
  }
  arg.dtype = dtype;
  arg.is_bf16 = dtype == "bfloat16";
  arg.data = reinterpret_cast<void*>(call_method(obj, torch.data_ptr).cast<uintptr_t>());
  return arg;
}

}  // namespace freetoken::bindings
