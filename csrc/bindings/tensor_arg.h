// Boundary checks on torch.Tensor arguments without compiling against libtorch: the tensor's own
// Python attributes (dtype, device, shape, is_contiguous, data_ptr) are read through pybind11, so
// the extension builds in seconds and does not depend on the torch C++ ABI. Header-only: every
// translation unit that includes pybind11 adds ~12 s to the build.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
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

// Checks that obj is a contiguous CPU torch.Tensor of rank `dim` whose dtype name (e.g.
// "float32", "bfloat16", "int64") is in `dtypes`. Raises TypeError for a non-tensor or a wrong
// dtype, ValueError for a wrong device, rank or layout; messages start with `name`.
inline TensorArg check_tensor(const py::handle& obj, const char* name, const char* layout,
                              int dim, const std::vector<std::string>& dtypes) {
  py::object torch = py::module_::import("torch");
  if (!py::isinstance(obj, torch.attr("Tensor"))) {
    throw py::type_error(std::string(name) + " must be a torch.Tensor, got " +
                         py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
  }
  const std::string device = py::str(obj.attr("device")).cast<std::string>();
  if (device != "cpu") {
    throw py::value_error(std::string(name) + " must be a CPU tensor, got device " + device);
  }
  // str(torch.bfloat16) == "torch.bfloat16"
  const std::string dtype = py::str(obj.attr("dtype")).cast<std::string>().substr(6);
  bool dtype_ok = false;
  std::string allowed;
  for (const auto& d : dtypes) {
    dtype_ok = dtype_ok || d == dtype;
    allowed += (allowed.empty() ? "" : " or ") + d;
  }
  if (!dtype_ok) {
    throw py::type_error(std::string(name) + " must be " + allowed + ", got " + dtype);
  }
  TensorArg arg;
  arg.obj = py::reinterpret_borrow<py::object>(obj);
  for (const auto& d : obj.attr("shape")) arg.shape.push_back(d.cast<int64_t>());
  if (static_cast<int>(arg.shape.size()) != dim) {
    throw py::value_error(std::string(name) + " must be " + std::to_string(dim) + "-D " + layout +
                          ", got shape " + shape_str(arg.shape));
  }
  if (!obj.attr("is_contiguous")().cast<bool>()) {
    throw py::value_error(std::string(name) + " must be contiguous");
  }
  arg.dtype = dtype;
  arg.is_bf16 = dtype == "bfloat16";
  arg.data = reinterpret_cast<void*>(obj.attr("data_ptr")().cast<uintptr_t>());
  return arg;
}

}  // namespace freetoken::bindings
