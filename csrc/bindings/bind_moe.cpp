// pybind11 glue for the CPU expert kernel: argument checks, GIL release, submit/wait handles.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>

#include "freetoken/attention.h"
#include "freetoken/dequant.h"
#include "freetoken/gdn.h"
#include "freetoken/linear.h"
#include "freetoken/moe.h"
#include "freetoken/q8.h"
#include "bank_args.h"
#include "runner.h"
#include "tensor_arg.h"

namespace freetoken::bindings {

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

// A torch fp32 tensor [rows, cols], filled by work(its data, the pool) on the process-wide
// runner (queued behind earlier submissions, the GIL released while it waits); a
// std::invalid_argument thrown by the work becomes a Python ValueError.
py::object run_on_pool(int64_t rows, int64_t cols,
                       std::function<void(float*, ThreadPool&)> work) {
  const TorchRefs& torch = torch_refs();
  py::object out = torch.empty(rows, cols, py::arg("dtype") = torch.float32);
  float* data = reinterpret_cast<float*>(call_method(out, torch.data_ptr).cast<uintptr_t>());
  MoeRunner& r = runner();
  {
    py::gil_scoped_release release;
    MoeTicket ticket =
        r.submit_work([data, work = std::move(work)](ThreadPool& pool) { work(data, pool); });
    r.wait(ticket);
    try {
      ticket.done.get();
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  }
  return out;
}

namespace {


// The pending result of one submit(); holds every tensor the kernel reads or writes.
class MoeHandle {
 public:
  MoeHandle(MoeTicket ticket, std::vector<py::object> keep, py::object out)
      : ticket_(std::move(ticket)), keep_(std::move(keep)), out_(std::move(out)) {}
  ~MoeHandle() {
    // The kernel may still read the kept tensors: finish before they can be freed.
    py::gil_scoped_release release;
    if (ticket_.done.valid()) runner().wait(ticket_);
  }
  py::object wait() {
    {
      py::gil_scoped_release release;
      runner().wait(ticket_);  // runs the job here when it is next and the pool is idle
    }
    ticket_.done.get();  // rethrows a kernel error
    return out_;
  }
  bool done() const {
    return ticket_.done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  // Wall seconds the job ran on the pool; -1.0 while it is not done (never blocks).
  double seconds() const { return done() ? *ticket_.seconds : -1.0; }

 private:
  MoeTicket ticket_;
  std::vector<py::object> keep_;
  py::object out_;
};

std::vector<int64_t> copy_i64(const TensorArg& t) {
  const auto* p = static_cast<const int64_t*>(t.data);
  return std::vector<int64_t>(p, p + t.shape[0]);
}

// Checks x, the routing and the two banks' agreement, then queues the problem.
std::unique_ptr<MoeHandle> submit_checked(const py::handle& x, const py::handle& token_ids,
                                          const py::handle& expert_ids, const py::handle& weights,
                                          BankArg gu, BankArg dn,
                                          const std::optional<std::string>& isa,
                                          const std::string& format_name,
                                          const std::string& activations, const GluArgs& glu) {
  const Activations act = parse_activations(activations, gu.bank.format, format_name);
  TensorArg xa = check_tensor(x, "x", "[T, H]", 2, {"float32", "bfloat16"});
  TensorArg ta = check_tensor(token_ids, "token_ids", "[P]", 1, {"int64"});
  TensorArg ea = check_tensor(expert_ids, "expert_ids", "[P]", 1, {"int64"});
  TensorArg wa = check_tensor(weights, "weights", "[P]", 1, {"float32"});
  if (ta.shape[0] != ea.shape[0] || ta.shape[0] != wa.shape[0]) {
    throw py::value_error("token_ids, expert_ids and weights must have the same length, got " +
                          shape_str(ta.shape) + ", " + shape_str(ea.shape) + ", " +
                          shape_str(wa.shape));
  }
  const int64_t n = dn.logical[0], h = dn.logical[1], i = dn.logical[2];
  if (gu.logical != std::vector<int64_t>{n, 2 * i, h}) {
    throw py::value_error("gate_up " + shape_str(gu.logical) + " does not match down " +
                          shape_str(dn.logical) + ": expected gate_up [N, 2I, H] = " +
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
  p.gate_up = gu.bank;
  p.down = dn.bank;
  p.token_ids = copy_i64(ta);
  p.expert_ids = copy_i64(ea);
  const auto* wp = static_cast<const float*>(wa.data);
  p.weights.assign(wp, wp + wa.shape[0]);
  try {
    validate_routing(p);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  std::vector<py::object> keep{xa.obj};
  apply_glu(glu, n, h, i, p, keep);
  p.isa = resolve_isa(isa);
  p.activations = act;
  const TorchRefs& torch = torch_refs();
  py::object out = torch.empty(p.num_tokens, h, py::arg("dtype") = torch.float32);
  p.out = reinterpret_cast<float*>(call_method(out, torch.data_ptr).cast<uintptr_t>());
  keep.insert(keep.end(), gu.keep.begin(), gu.keep.end());
  keep.insert(keep.end(), dn.keep.begin(), dn.keep.end());
  MoeRunner& r = runner();
  MoeTicket ticket;
  {
    py::gil_scoped_release release;
    ticket = r.submit(std::move(p));
  }
  return std::make_unique<MoeHandle>(std::move(ticket), std::move(keep), out);
}

// Dense banks: the format follows the dtype (bfloat16 or float32, the same for both banks).
std::unique_ptr<MoeHandle> submit(const py::handle& x, const py::handle& token_ids,
                                  const py::handle& expert_ids, const py::handle& weights,
                                  const py::handle& gate_up, const py::handle& down,
                                  const std::optional<std::string>& isa,
                                  const std::string& activations, const py::object& gate_up_bias,
                                  const py::object& down_bias,
                                  std::optional<double> swiglu_limit, double swiglu_alpha) {
  TensorArg gu = check_tensor(gate_up, "gate_up", "[N, 2I, H]", 3, {"float32", "bfloat16"});
  TensorArg dn = check_tensor(down, "down", "[N, H, I]", 3, {"float32", "bfloat16"});
  if (gu.dtype != dn.dtype) {
    throw py::value_error("gate_up and down must have the same dtype, got " + gu.dtype +
                          " and " + dn.dtype);
  }
  const std::string format = gu.is_bf16 ? "bf16" : "fp32";
  return submit_checked(x, token_ids, expert_ids, weights,
                        check_bank(format, py::make_tuple(gate_up), "gate_up", "[N, 2I, H]"),
                        check_bank(format, py::make_tuple(down), "down", "[N, H, I]"), isa, format,
                        activations, {gate_up_bias, down_bias, swiglu_limit, swiglu_alpha});
}

std::unique_ptr<MoeHandle> submit_banks(const py::handle& x, const py::handle& token_ids,
                                        const py::handle& expert_ids, const py::handle& weights,
                                        const std::string& format, const py::tuple& gate_up,
                                        const py::tuple& down,
                                        const std::optional<std::string>& isa,
                                        const std::string& activations,
                                        const py::object& gate_up_bias,
                                        const py::object& down_bias,
                                        std::optional<double> swiglu_limit,
                                        double swiglu_alpha, const BlockSize& block_size) {
  return submit_checked(x, token_ids, expert_ids, weights,
                        check_bank(format, gate_up, "gate_up", "[N, 2I, H]", block_size),
                        check_bank(format, down, "down", "[N, H, I]", block_size), isa, format,
                        activations, {gate_up_bias, down_bias, swiglu_limit, swiglu_alpha});
}

// out [T, R] fp32 = x [T, C] @ w [R, C]^T (dense bf16 / fp32 w), blocking, GIL released; queued
// behind earlier MoE submissions on the same pool.
py::object linear(const py::handle& x, const py::handle& w, const std::optional<std::string>& isa) {
  TensorArg xa = check_tensor(x, "x", "[T, C]", 2, {"float32", "bfloat16"});
  TensorArg wa = check_tensor(w, "w", "[R, C]", 2, {"float32", "bfloat16"});
  if (xa.shape[1] != wa.shape[1]) {
    throw py::value_error("x " + shape_str(xa.shape) + " and w " + shape_str(wa.shape) +
                          " disagree on C (the input features)");
  }
  LinearProblem p;
  p.x = xa.data;
  p.x_is_bf16 = xa.is_bf16;
  p.rows = xa.shape[0];
  p.in = xa.shape[1];
  p.out_features = wa.shape[0];
  p.format = wa.is_bf16 ? WeightFormat::kBf16 : WeightFormat::kFp32;
  p.w = wa.data;
  p.isa = resolve_isa(isa);
  return run_on_pool(p.rows, p.out_features, [p](float* out, ThreadPool& pool) mutable {
    p.out = out;
    linear_forward(p, pool);
  });
}

// The q8 block quantiser on v [R, C] fp32 in column order (tests compare it with the torch one).
py::tuple quantize_q8_natural(const py::handle& v) {
  TensorArg va = check_tensor(v, "v", "[R, C]", 2, {"float32"});
  const int64_t rows = va.shape[0], cols = va.shape[1];
  if (cols % kQ8Block != 0) {
    throw py::value_error("v " + shape_str(va.shape) + ": C must be a multiple of 32");
  }
  py::module_ torch = py::module_::import("torch");
  py::object q = torch.attr("empty")(rows, cols, py::arg("dtype") = torch.attr("int8"));
  py::object d =
      torch.attr("empty")(rows, cols / kQ8Block, py::arg("dtype") = torch.attr("float32"));
  auto* qp = reinterpret_cast<int8_t*>(q.attr("data_ptr")().cast<uintptr_t>());
  auto* dp = reinterpret_cast<float*>(d.attr("data_ptr")().cast<uintptr_t>());
  const auto* src = static_cast<const float*>(va.data);
  std::vector<float> slots(q8_scale_slots(cols));
  std::vector<int32_t> sums(slots.size());
  for (int64_t r = 0; r < rows; ++r) {
    quantize_q8(Q8Layout::kNatural, src + r * cols, 0, cols, cols, qp + r * cols, slots.data(),
                sums.data());
    std::copy(slots.begin(), slots.begin() + cols / kQ8Block, dp + r * (cols / kQ8Block));
  }
  return py::make_tuple(q, d);
}

}  // namespace

namespace {

// Dense copies of experts `ids` of an MXFP4 bank (freetoken/dequant.h) into `out` [n, R, C]
// float32 / bfloat16. Blocking, GIL released, queued behind earlier pool work.
void dequantize_experts(const std::string& format, const py::tuple& bank, const py::handle& ids,
                        const py::handle& out, const std::optional<std::string>& isa) {
  if (format != "mxfp4") {
    throw py::value_error("dequantize_experts reads mxfp4 banks only, got " + format);
  }
  BankArg b = check_bank(format, bank, "bank", "[N, R, C]");
  TensorArg ia = check_tensor(ids, "ids", "[n]", 1, {"int64"});
  TensorArg oa = check_tensor(out, "out", "[n, R, C]", 3, {"float32", "bfloat16"});
  const int64_t N = b.logical[0], R = b.logical[1], C = b.logical[2], n = ia.shape[0];
  if (oa.shape != std::vector<int64_t>{n, R, C}) {
    throw py::value_error("out " + shape_str(oa.shape) + " must be [n, R, C] = " +
                          shape_str({n, R, C}));
  }
  const auto* id = static_cast<const int64_t*>(ia.data);
  for (int64_t i = 0; i < n; ++i) {
    if (id[i] < 0 || id[i] >= N) {
      throw py::value_error("ids[" + std::to_string(i) + "] = " + std::to_string(id[i]) +
                            " outside [0, " + std::to_string(N) + ")");
    }
  }
  const auto* blocks = static_cast<const uint8_t*>(b.bank.values);
  const auto* scales = static_cast<const uint8_t*>(b.bank.scales);
  void* data = oa.data;
  const bool bf16 = oa.is_bf16;
  const Isa variant = resolve_isa(isa);
  MoeRunner& r = runner();
  py::gil_scoped_release release;
  MoeTicket ticket = r.submit_work([=](ThreadPool& pool) {
    dequantize_mxfp4_experts(blocks, scales, R, C, id, n, bf16, data, variant, pool);
  });
  r.wait(ticket);
  ticket.done.get();
}

}  // namespace

void bind_moe(py::module_& m) {
  py::class_<MoeHandle>(m, "MoeHandle", "Pending CPU MoE result; wait() returns out [T, H] fp32.")
      .def("wait", &MoeHandle::wait, "Block (GIL released) until done; return out [T, H] fp32.")
      .def("done", &MoeHandle::done, "True when the result is ready (never blocks).")
      .def("seconds", &MoeHandle::seconds,
           "Wall seconds the job ran on the pool (steady_clock); -1.0 until done (never blocks).");
  m.def("submit", &submit, py::arg("x"), py::arg("token_ids"), py::arg("expert_ids"),
        py::arg("weights"), py::arg("gate_up"), py::arg("down"), py::kw_only(),
        py::arg("isa") = py::none(), py::arg("activations") = "fp32",
        py::arg("gate_up_bias") = py::none(), py::arg("down_bias") = py::none(),
        py::arg("swiglu_limit") = py::none(), py::arg("swiglu_alpha") = 1.702,
        "Queue the SwiGLU expert MLP for (token, expert, weight) triples; returns a MoeHandle.");
  m.def("submit_banks", &submit_banks, py::arg("x"), py::arg("token_ids"), py::arg("expert_ids"),
        py::arg("weights"), py::arg("format"), py::arg("gate_up"), py::arg("down"),
        py::kw_only(), py::arg("isa") = py::none(), py::arg("activations") = "fp32",
        py::arg("gate_up_bias") = py::none(), py::arg("down_bias") = py::none(),
        py::arg("swiglu_limit") = py::none(), py::arg("swiglu_alpha") = 1.702,
        py::arg("block_size") = py::none(),
        "submit() for banks in any format: gate_up / down are tuples of tensors (bank_args.h); "
        "block_size (bm, bn): the fp8 scale block, fp8 banks only.");
  m.def("dequantize_experts", &dequantize_experts, py::arg("format"), py::arg("bank"),
        py::arg("ids"), py::arg("out"), py::arg("isa") = py::none(),
        "Dense copies of experts ids of an mxfp4 bank (blocks, scales) into out [n, R, C] "
        "float32 / bfloat16 (freetoken/dequant.h).");
  m.def("linear", &linear, py::arg("x"), py::arg("w"), py::arg("isa") = py::none(),
        "Dense linear at decode sizes: x [T, C] fp32/bf16 @ w [R, C]^T (bf16 or fp32, "
        "contiguous CPU) -> [T, R] fp32, on the kernel's pool (blocking, GIL released).");
  m.def("quantize_q8", &quantize_q8_natural, py::arg("v"),
        "Block int8 quantisation (freetoken/q8.h) of v [R, C] fp32 contiguous CPU, C a multiple "
        "of 32: returns (q [R, C] int8, d [R, C/32] fp32), column order.");
  m.def("num_threads", [] { return runner().num_threads(); },
        "Worker threads of the process-wide pool (starts it).");
  m.def("physical_cores", &physical_core_count, "Physical cores in this process's affinity mask.");
  m.def("cpu_has_avx512_vnni", &cpu_has_avx512_vnni,
        "Whether the CPU reports AVX512_VNNI with the avx512 variant's features (the "
        "q8_avx512_vnni kernel needs it).");
  m.def("cpu_has_avx512_vbmi", &cpu_has_avx512_vbmi,
        "Whether the CPU reports AVX512_VBMI with the avx512_bf16 variant's features (the "
        "fp8_dpbf16 kernel needs both).");
  m.def("supported_isas", [] {
    std::vector<std::string> names;
    for (Isa s : supported_isas()) names.emplace_back(isa_name(s));
    return names;
  }, "ISA variants this CPU can run, best last.");
  m.def("kernels", [] {
    std::vector<py::tuple> rows;
    const std::vector<uint64_t> uses = kernel_use_counts();
    for (const RowsKernel& k : all_rows_kernels()) {
      rows.push_back(py::make_tuple(std::string(k.name), std::string(isa_name(k.needs)),
                                    uses[k.id]));
    }
    const auto add = [&rows](const auto& kernels) {
      for (size_t i = 0; i < kernels.variants().size(); ++i) {
        const auto& v = kernels.variants()[i];
        rows.push_back(py::make_tuple(std::string(v.name), std::string(isa_name(v.needs)),
                                      kernels.uses(i)));
      }
    };
    add(attend_kernels());
    add(delta_rule_kernels());
    return rows;
  }, "Every CPU kernel (the rows_dot kernels, then the decode attention cores and delta-rule "
     "steps) as (name, lowest ISA variant that runs it, calls in this process).");
}

}  // namespace freetoken::bindings
