// The extension module freetoken.ops.cpu_moe._ext: one bind_<concern>() per file.
#include <pybind11/pybind11.h>

namespace freetoken::bindings {
void bind_moe(pybind11::module_& m);
void bind_decode(pybind11::module_& m);
void bind_stack(pybind11::module_& m);
}

PYBIND11_MODULE(_ext, m) {
  m.doc() = "FreeToken C++ CPU expert kernel (see freetoken/ops/cpu_moe)";
  freetoken::bindings::bind_moe(m);
  freetoken::bindings::bind_decode(m);
  freetoken::bindings::bind_stack(m);
}
