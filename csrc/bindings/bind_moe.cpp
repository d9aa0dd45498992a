// pybind11 glue for the CPU expert kernel: argument checks, GIL release, submit/wait handles.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>

#include "freetoken/moe.h"
#include "tensor_arg.h"

namespace freetoken::bindings {

namespace {

// One runner per process, created on first use with FREETOKEN_CPU_MOE_THREADS workers (default:
// physical cores). NOTE: deliberately leaked so that no thread is joined during interpreter exit.
MoeRunner& runner() {
  static MoeRunner* r = [] {
    int threads = physical_core_count();
    if (const char* env = std::getenv("FREETOKEN_CPU_MOE_THREADS"); env && *env) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (*end != '\0' || v < 1 || v > 1024) {
        throw py::value_error("FREETOKEN_CPU_MOE_THREADS must be an integer in [1, 1024], got '" +
                              std::string(env) + "'");
      }
      threads = static_cast<int>(v);
    }
    return new MoeRunner(threads);
  }();
  return *r;
}

Isa resolve_isa(const std::optional<std::string>& requested) {
  std::string name;
  if (requested) {
    name = *requested;
  } else if (const char* env = std::getenv("FREETOKEN_CPU_MOE_ISA"); env && *env) {
    name = env;
  } else {
    return best_isa();
  }
  Isa isa;
  try {
    isa = parse_isa(name);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  std::string supported;
  bool ok = false;
  for (Isa s : supported_isas()) {
    ok = ok || s == isa;
    supported += (supported.empty() ? "" : ", ") + std::string(isa_name(s));
  }
  if (!ok) {
    throw py::value_error("CPU MoE ISA '" + name + "' is not supported by this CPU (supported: " +
                          supported + ")");
  }
  return isa;
}

// The pending result of one submit(); holds every tensor the kernel reads or writes.
class MoeHandle {
 public:
  MoeHandle(std::shared_future<void> fut, std::vector<py::object> keep, py::object out)
      : fut_(std::move(fut)), keep_(std::move(keep)), out_(std::move(out)) {}
  ~MoeHandle() {
    // The kernel may still read the kept tensors: finish before they can be freed.
    py::gil_scoped_release release;
    if (fut_.valid()) fut_.wait();
  }
  py::object wait() {
    {
      py::gil_scoped_release release;
      fut_.wait();
    }
    fut_.get();  // rethrows a kernel error
    return out_;
  }
  bool done() const {
    return fut_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> fut_;
  std::vector<py::object> keep_;
  py::object out_;
};

std::vector<int64_t> copy_i64(const TensorArg& t) {
  const auto* p = static_cast<const int64_t*>(t.data);
  return std::vector<int64_t>(p, p + t.shape[0]);
}

std::unique_ptr<MoeHandle> submit(const py::handle& x, const py::handle& token_ids, const py::handle& expert_ids,
                  const py::handle& weights, const py::handle& gate_up, const py::handle& down,
                  const std::optional<std::string>& isa) {
  TensorArg xa = check_tensor(x, "x", "[T, H]", 2, {"float32", "bfloat16"});
  TensorArg ta = check_tensor(token_ids, "token_ids", "[P]", 1, {"int64"});
  TensorArg ea = check_tensor(expert_ids, "expert_ids", "[P]", 1, {"int64"});
  TensorArg wa = check_tensor(weights, "weights", "[P]", 1, {"float32"});
  TensorArg gu = check_tensor(gate_up, "gate_up", "[N, 2I, H]", 3, {"bfloat16"});
  TensorArg dn = check_tensor(down, "down", "[N, H, I]", 3, {"bfloat16"});
  if (ta.shape[0] != ea.shape[0] || ta.shape[0] != wa.shape[0]) {
    throw py::value_error("token_ids, expert_ids and weights must have the same length, got " +
                          shape_str(ta.shape) + ", " + shape_str(ea.shape) + ", " +
                          shape_str(wa.shape));
  }
  const int64_t n = dn.shape[0], h = dn.shape[1], i = dn.shape[2];
  if (gu.shape[0] != n || gu.shape[1] != 2 * i || gu.shape[2] != h) {
    throw py::value_error("gate_up " + shape_str(gu.shape) + " does not match down " +
                          shape_str(dn.shape) + ": expected gate_up [N, 2I, H] = " +
                          shape_str({n, 2 * i, h}));
  }
  if (xa.shape[1] != h) {
    throw py::value_error("x " + shape_str(xa.shape) + " has hidden size " +
                          std::to_string(xa.shape[1]) + " but the expert banks have H = " +
                          std::to_string(h));
  }
  MoeProblem p;
  p.x = xa.data;
  p.x_is_bf16 = xa.is_bf16;
  p.num_tokens = xa.shape[0];
  p.hidden = h;
  p.intermediate = i;
  p.num_experts = n;
  p.gate_up = static_cast<const uint16_t*>(gu.data);
  p.down = static_cast<const uint16_t*>(dn.data);
  p.token_ids = copy_i64(ta);
  p.expert_ids = copy_i64(ea);
  const auto* wp = static_cast<const float*>(wa.data);
  p.weights.assign(wp, wp + wa.shape[0]);
  try {
    validate_routing(p);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  p.isa = resolve_isa(isa);
  py::object torch = py::module_::import("torch");
  py::object out = torch.attr("empty")(py::make_tuple(p.num_tokens, h),
                                       py::arg("dtype") = torch.attr("float32"));
  p.out = reinterpret_cast<float*>(out.attr("data_ptr")().cast<uintptr_t>());
  MoeRunner& r = runner();
  std::shared_future<void> fut;
  {
    py::gil_scoped_release release;
    fut = r.submit(std::move(p));
  }
  return std::make_unique<MoeHandle>(std::move(fut), std::vector<py::object>{xa.obj, gu.obj, dn.obj},
                                     out);
}

}  // namespace

void bind_moe(py::module_& m) {
  py::class_<MoeHandle>(m, "MoeHandle", "Pending CPU MoE result; wait() returns out [T, H] fp32.")
      .def("wait", &MoeHandle::wait, "Block (GIL released) until done; return out [T, H] fp32.")
      .def("done", &MoeHandle::done, "True when the result is ready (never blocks).");
  m.def("submit", &submit, py::arg("x"), py::arg("token_ids"), py::arg("expert_ids"),
        py::arg("weights"), py::arg("gate_up"), py::arg("down"), py::arg("isa") = py::none(),
        "Queue the SwiGLU expert MLP for (token, expert, weight) triples; returns a MoeHandle.");
  m.def("num_threads", [] { return runner().num_threads(); },
        "Worker threads of the process-wide pool (starts it).");
  m.def("physical_cores", &physical_core_count, "Physical cores in this process's affinity mask.");
  m.def("supported_isas", [] {
    std::vector<std::string> names;
    for (Isa s : supported_isas()) names.emplace_back(isa_name(s));
    return names;
  }, "ISA variants this CPU can run, best last.");
}

}  // namespace freetoken::bindings
