// pybind11 glue for the decode ops (freetoken/attention.h, moe_block.h, gdn.h): argument checks,
// then one blocking job on the process-wide runner (runner.h), GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "decode_args.h"
#include "runner.h"
#include "tensor_arg.h"

namespace freetoken::bindings {

namespace {

// The optional input RMSNorm multiplier of a decode op: None, or [H] fp32 (kept alive by keep).
const float* input_norm_of(const py::handle& input_norm, int64_t hidden,
                           std::vector<TensorArg>& keep) {
  if (input_norm.is_none()) return nullptr;
  TensorArg arg = check_tensor(input_norm, "input_norm", "[H]", 1, {"float32"});
  if (arg.shape[0] != hidden) {
    throw py::value_error("input_norm " + shape_str(arg.shape) + " must be [" +
                          std::to_string(hidden) + "]");
  }
  keep.push_back(arg);
  return static_cast<const float*>(arg.data);
}

[[noreturn]] void fail(const std::string& what) { throw py::value_error(what); }

const float* fp32_data(const TensorArg& a) { return static_cast<const float*>(a.data); }

// An optional fp32 vector argument: None, or [n] float32 (kept alive by keep).
const float* fp32_vector(const py::handle& obj, const char* name, const char* layout, int64_t n,
                         std::vector<TensorArg>& keep) {
  if (obj.is_none()) return nullptr;
  TensorArg arg = check_tensor(obj, name, layout, 1, {"float32"});
  if (arg.shape[0] != n) {
    fail(std::string(name) + " " + shape_str(arg.shape) + " must be [" + std::to_string(n) +
         "]");
  }
  keep.push_back(arg);
  return fp32_data(arg);
}

}  // namespace

void attention_weights(DecodeAttentionProblem& p, const std::string& dtype, int64_t hidden,
                       const py::handle& qkv_w, const py::handle& o_w, const py::handle& q_norm,
                       const py::handle& k_norm, int64_t num_heads, int64_t num_kv_heads,
                       bool gated, double eps, double scale, const py::handle& input_norm,
                       double input_eps, std::vector<TensorArg>& keep,
                       const py::handle& qkv_bias, const py::handle& sinks, int64_t window,
                       const py::handle& o_bias) {
  const std::vector<std::string> same = {dtype};
  TensorArg qa = check_tensor(qkv_w, "qkv_w", "[rows, H]", 2, same);
  TensorArg oa = check_tensor(o_w, "o_w", "[H, nh * hd]", 2, same);
  if (num_kv_heads < 1 || num_heads % num_kv_heads != 0) {
    fail("num_heads " + std::to_string(num_heads) + " is not a multiple of num_kv_heads " +
         std::to_string(num_kv_heads));
  }
  if (q_norm.is_none() != k_norm.is_none()) fail("q_norm and k_norm must both be given or None");
  const bool norms = !q_norm.is_none();
  // rows = hd * (nh * (gated ? 2 : 1) + 2 * nkv): head_dim from the norms, else from qkv_w
  const int64_t per_hd = num_heads * (gated ? 2 : 1) + 2 * num_kv_heads;
  TensorArg qn, kn;
  if (norms) {
    qn = check_tensor(q_norm, "q_norm", "[hd]", 1, {"float32"});
    kn = check_tensor(k_norm, "k_norm", "[hd]", 1, {"float32"});
  }
  const int64_t hd = norms ? qn.shape[0] : qa.shape[0] / per_hd;
  const int64_t nq = num_heads * hd, q_rows = nq * (gated ? 2 : 1);
  if (hd < 1 || (norms && kn.shape[0] != hd)) fail("q_norm / k_norm must be [hd]");
  if (qa.shape[0] != q_rows + 2 * num_kv_heads * hd || qa.shape[1] != hidden) {
    fail("qkv_w " + shape_str(qa.shape) + " must be [" +
         std::to_string(q_rows + 2 * num_kv_heads * hd) + ", " + std::to_string(hidden) + "]");
  }
  if (oa.shape[0] != hidden || oa.shape[1] != nq) {
    fail("o_w " + shape_str(oa.shape) + " must be [" + std::to_string(hidden) + ", " +
         std::to_string(nq) + "]");
  }
  p.hidden = hidden;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = hd;
  p.gated = gated;
  p.bf16 = qa.is_bf16;
  p.qkv_w = qa.data;
  p.o_w = oa.data;
  p.q_norm = norms ? fp32_data(qn) : nullptr;
  p.k_norm = norms ? fp32_data(kn) : nullptr;
  if (!qkv_bias.is_none()) {
    TensorArg ba = check_tensor(qkv_bias, "qkv_bias", "[rows]", 1, {"float32"});
    if (ba.shape[0] != qa.shape[0]) {
      fail("qkv_bias " + shape_str(ba.shape) + " must be [" + std::to_string(qa.shape[0]) + "]");
    }
    p.qkv_bias = fp32_data(ba);
    keep.push_back(std::move(ba));
  }
  if (window < 0) fail("window must be >= 0 (0: no window), got " + std::to_string(window));
  p.sinks = fp32_vector(sinks, "sinks", "[nh]", num_heads, keep);
  p.window = window;
  p.o_bias = fp32_vector(o_bias, "o_bias", "[H]", hidden, keep);
  p.eps = static_cast<float>(eps);
  p.scale = static_cast<float>(scale);
  p.input_norm = input_norm_of(input_norm, hidden, keep);
  p.input_eps = static_cast<float>(input_eps);
  for (TensorArg* a : {&qa, &oa}) keep.push_back(std::move(*a));
  if (norms) {
    for (TensorArg* a : {&qn, &kn}) keep.push_back(std::move(*a));
  }
}

void attention_step(DecodeAttentionProblem& p, int64_t batch, const py::handle& cos,
                    const py::handle& sin, const py::handle& kv_slots,
                    const py::handle& kv_offsets, std::vector<TensorArg>& keep) {
  TensorArg ca = check_tensor(cos, "cos", "[B, rot / 2]", 2, {"float32"});
  TensorArg sa = check_tensor(sin, "sin", "[B, rot / 2]", 2, {"float32"});
  TensorArg sl = check_tensor(kv_slots, "kv_slots", "[N]", 1, {"int64"});
  TensorArg of = check_tensor(kv_offsets, "kv_offsets", "[B + 1]", 1, {"int64"});
  if (ca.shape != sa.shape || ca.shape[0] != batch || 2 * ca.shape[1] > p.head_dim) {
    fail("cos " + shape_str(ca.shape) + " / sin " + shape_str(sa.shape) + " must be [" +
         std::to_string(batch) + ", rot / 2] with rot <= head_dim");
  }
  if (of.shape[0] != batch + 1) fail("kv_offsets must be [B + 1]");
  const auto* off = static_cast<const int64_t*>(of.data);
  for (int64_t b = 0; b <= batch; ++b) {
    if (off[b] < 0 || off[b] > sl.shape[0] || (b && off[b] < off[b - 1])) {
      fail("kv_offsets must be non-decreasing within [0, " + std::to_string(sl.shape[0]) + "]");
    }
  }
  p.batch = batch;
  p.rotary_half = ca.shape[1];
  p.cos = fp32_data(ca);
  p.sin = fp32_data(sa);
  p.kv_slots = static_cast<const int64_t*>(sl.data);
  p.kv_offsets = off;
  for (TensorArg* a : {&ca, &sa, &sl, &of}) keep.push_back(std::move(*a));
}

void gdn_weights(GdnDecodeProblem& p, const std::string& dtype, int64_t hidden,
                 const py::handle& in_w, const py::handle& conv_w, const py::handle& dt_bias,
                 const py::handle& a_log, const py::handle& norm_w, const py::handle& out_w,
                 int64_t num_k_heads, int64_t num_v_heads, double eps,
                 const py::handle& input_norm, double input_eps, std::vector<TensorArg>& keep) {
  const std::vector<std::string> same = {dtype};
  TensorArg ia = check_tensor(in_w, "in_w", "[rows, H]", 2, same);
  TensorArg ca = check_tensor(conv_w, "conv_w", "[conv_dim, K]", 2, same);
  TensorArg oa = check_tensor(out_w, "out_w", "[H, Hv * dv]", 2, same);
  TensorArg dt = check_tensor(dt_bias, "dt_bias", "[Hv]", 1, {"float32"});
  TensorArg al = check_tensor(a_log, "a_log", "[Hv]", 1, {"float32"});
  TensorArg nw = check_tensor(norm_w, "norm_w", "[dv]", 1, {"float32"});
  if (num_k_heads < 1 || num_v_heads % num_k_heads != 0) {
    fail("num_v_heads " + std::to_string(num_v_heads) + " is not a multiple of num_k_heads " +
         std::to_string(num_k_heads));
  }
  if (nw.shape[0] < 1 || oa.shape[0] != hidden || oa.shape[1] != num_v_heads * nw.shape[0]) {
    fail("out_w " + shape_str(oa.shape) + " must be [" + std::to_string(hidden) + ", Hv * dv]");
  }
  const int64_t dv = nw.shape[0], value_dim = num_v_heads * dv;
  const int64_t conv_dim = ca.shape[0], K = ca.shape[1];
  const int64_t key_dim = (conv_dim - value_dim) / 2, dk = key_dim / num_k_heads;
  if (K < 1 || key_dim <= 0 || 2 * key_dim + value_dim != conv_dim || dk * num_k_heads != key_dim) {
    fail("conv_w " + shape_str(ca.shape) + " must be [2 * Hk * dk + Hv * dv, K]");
  }
  if (ia.shape[0] != conv_dim + value_dim + 2 * num_v_heads || ia.shape[1] != hidden) {
    fail("in_w " + shape_str(ia.shape) + " must be [" +
         std::to_string(conv_dim + value_dim + 2 * num_v_heads) + ", " + std::to_string(hidden) +
         "]");
  }
  if (dt.shape[0] != num_v_heads || al.shape[0] != num_v_heads) {
    fail("dt_bias / a_log must be [" + std::to_string(num_v_heads) + "]");
  }
  p.hidden = hidden;
  p.num_k_heads = num_k_heads;
  p.num_v_heads = num_v_heads;
  p.k_dim = dk;
  p.v_dim = dv;
  p.conv_kernel = K;
  p.bf16 = ia.is_bf16;
  p.in_w = ia.data;
  p.conv_w = ca.data;
  p.dt_bias = fp32_data(dt);
  p.a_log = fp32_data(al);
  p.norm_w = fp32_data(nw);
  p.eps = static_cast<float>(eps);
  p.out_w = oa.data;
  p.input_norm = input_norm_of(input_norm, hidden, keep);
  p.input_eps = static_cast<float>(input_eps);
  for (TensorArg* a : {&ia, &ca, &oa, &dt, &al, &nw}) keep.push_back(std::move(*a));
}

void gdn_states(const GdnDecodeProblem& p, const std::string& dtype, int64_t batch,
                const py::list& conv_states, const py::list& recurrent, std::vector<void*>& conv,
                std::vector<float*>& rec, std::vector<TensorArg>& keep) {
  if (static_cast<int64_t>(conv_states.size()) != batch ||
      static_cast<int64_t>(recurrent.size()) != batch) {
    fail("conv_states and recurrent need one tensor per sequence (" + std::to_string(batch) +
         ")");
  }
  const int64_t conv_dim = 2 * p.num_k_heads * p.k_dim + p.num_v_heads * p.v_dim;
  const int64_t K = p.conv_kernel;
  conv.clear();
  rec.clear();
  for (int64_t b = 0; b < batch; ++b) {
    TensorArg c = check_tensor(conv_states[b], "conv_states[b]", "[conv_dim, K-1]", 2, {dtype});
    TensorArg r = check_tensor(recurrent[b], "recurrent[b]", "[Hv, dk, dv]", 3, {"float32"});
    if (c.shape != std::vector<int64_t>{conv_dim, K - 1} ||
        r.shape != std::vector<int64_t>{p.num_v_heads, p.k_dim, p.v_dim}) {
      fail("sequence " + std::to_string(b) + ": conv state " + shape_str(c.shape) +
           " / recurrent state " + shape_str(r.shape) + " must be [" + std::to_string(conv_dim) +
           ", " + std::to_string(K - 1) + "] / [" + std::to_string(p.num_v_heads) + ", " +
           std::to_string(p.k_dim) + ", " + std::to_string(p.v_dim) + "]");
    }
    conv.push_back(c.data);
    rec.push_back(static_cast<float*>(r.data));
    keep.push_back(std::move(c));
    keep.push_back(std::move(r));
  }
}

void moe_weights(MoeBlockProblem& p, const std::string& dtype, int64_t hidden,
                 const py::handle& norm, double eps, const py::handle& router,
                 const ExpertsArgs& experts, const py::handle& shared_gate_up,
                 const py::handle& shared_down, int64_t top_k, bool norm_topk_prob,
                 std::vector<TensorArg>& keep,
                 const py::handle& score_bias, int64_t n_group, int64_t topk_group,
                 double routed_scaling, const py::handle& router_bias, const GluArgs& glu) {
  const std::vector<std::string> same = {dtype};
  const bool sigmoid = !score_bias.is_none();
  if (!router_bias.is_none() && sigmoid) fail("router_bias and score_bias select two routings");
  if (!router_bias.is_none() && !shared_gate_up.is_none()) {
    fail("router_bias (gpt-oss routing) takes no shared expert");
  }
  TensorArg na = check_tensor(norm, "norm", "[H]", 1, {"float32"});
  TensorArg ra = sigmoid ? check_tensor(router, "router", "[E, H]", 2, {"float32"})
                         : check_tensor(router, "router", "[E (+1), H]", 2, same);
  const std::string dense_format = dtype == "bfloat16" ? "bf16" : "fp32";
  const std::string format = experts.format.value_or(dense_format);
  BankArg gu, dn;
  if (!experts.format) {
    if (experts.block_size) fail("block_size applies to fp8 expert banks only");
    TensorArg g = check_tensor(experts.gate_up, "gate_up", "[E, 2I, H]", 3, same);
    TensorArg d = check_tensor(experts.down, "down", "[E, H, I]", 3, same);
    gu = check_bank(format, py::make_tuple(g.obj), "gate_up", "[E, 2I, H]");
    dn = check_bank(format, py::make_tuple(d.obj), "down", "[E, H, I]");
  } else {
    for (const auto& [obj, name] : {std::pair{&experts.gate_up, "gate_up"},
                                    std::pair{&experts.down, "down"}}) {
      if (!py::isinstance<py::tuple>(*obj)) {
        fail(std::string(name) + " must be a tuple of the bank's tensors with expert_format '" +
             format + "'");
      }
    }
    gu = check_bank(format, experts.gate_up, "gate_up", "[E, 2I, H]", experts.block_size);
    dn = check_bank(format, experts.down, "down", "[E, H, I]", experts.block_size);
  }
  const int64_t H = hidden, E = gu.logical[0], I = gu.logical[1] / 2;
  const bool shared = !shared_gate_up.is_none();
  if (shared == shared_down.is_none()) fail("shared_gate_up and shared_down go together");
  if (na.shape[0] != H) fail("norm must be [" + std::to_string(H) + "]");
  if (gu.logical[1] != 2 * I || gu.logical[2] != H ||
      dn.logical != std::vector<int64_t>{E, H, I}) {
    fail("gate_up " + shape_str(gu.logical) + " / down " + shape_str(dn.logical) +
         " must be [E, 2I, " + std::to_string(H) + "] / [E, " + std::to_string(H) + ", I]");
  }
  p.activations = parse_activations(experts.activations, gu.bank.format, format);
  const int64_t router_rows = E + (shared && !sigmoid ? 1 : 0);
  if (ra.shape[0] != router_rows || ra.shape[1] != H) {
    fail("router " + shape_str(ra.shape) + " must be [" + std::to_string(router_rows) + ", " +
         std::to_string(H) + "]");
  }
  if (sigmoid) {
    TensorArg ba = check_tensor(score_bias, "score_bias", "[E]", 1, {"float32"});
    if (ba.shape[0] != E) fail("score_bias must be [" + std::to_string(E) + "]");
    if (n_group < 1 || E % n_group != 0 || E / n_group < 2 || topk_group < 1 ||
        topk_group > n_group || top_k > topk_group * (E / n_group)) {
      fail("n_group " + std::to_string(n_group) + " / topk_group " + std::to_string(topk_group) +
           " do not fit " + std::to_string(E) + " experts and top_k " + std::to_string(top_k));
    }
    p.score_bias = fp32_data(ba);
    p.n_group = n_group;
    p.topk_group = topk_group;
    p.routed_scaling = static_cast<float>(routed_scaling);
    keep.push_back(std::move(ba));
  }
  if (top_k < 1 || top_k > E) {
    fail("top_k " + std::to_string(top_k) + " outside [1, " + std::to_string(E) + "]");
  }
  p.router_bias = fp32_vector(router_bias, "router_bias", "[E]", E, keep);
  MoeProblem problem;
  std::vector<py::object> glu_keep;
  apply_glu(glu, E, H, I, problem, glu_keep);
  for (BankArg* b : {&gu, &dn}) glu_keep.insert(glu_keep.end(), b->keep.begin(), b->keep.end());
  for (py::object& obj : glu_keep) keep.push_back(TensorArg{std::move(obj)});
  p.gate_up_bias = problem.gate_up_bias;
  p.down_bias = problem.down_bias;
  p.swiglu_clamp = problem.swiglu_clamp;
  p.swiglu_limit = problem.swiglu_limit;
  p.swiglu_alpha = problem.swiglu_alpha;
  if (shared) {
    TensorArg sg = check_tensor(shared_gate_up, "shared_gate_up", "[2Is, H]", 2, same);
    TensorArg sd = check_tensor(shared_down, "shared_down", "[H, Is]", 2, same);
    const int64_t is = sg.shape[0] / 2;
    if (sg.shape[0] != 2 * is || sg.shape[1] != H || sd.shape != std::vector<int64_t>{H, is}) {
      fail("shared_gate_up " + shape_str(sg.shape) + " / shared_down " + shape_str(sd.shape) +
           " must be [2Is, " + std::to_string(H) + "] / [" + std::to_string(H) + ", Is]");
    }
    p.shared_intermediate = is;
    p.shared_gate_up = sg.data;
    p.shared_down = sd.data;
    keep.push_back(std::move(sg));
    keep.push_back(std::move(sd));
  }
  p.hidden = H;
  p.num_experts = E;
  p.intermediate = I;
  p.top_k = top_k;
  p.norm_topk_prob = norm_topk_prob;
  p.bf16 = dtype == "bfloat16";
  p.norm = fp32_data(na);
  p.eps = static_cast<float>(eps);
  p.router = ra.data;
  p.gate_up = gu.bank;
  p.down = dn.bank;
  for (TensorArg* a : {&na, &ra}) keep.push_back(std::move(*a));
}

py::object empty_int64(int64_t rows, int64_t cols, int64_t** data) {
  const TorchRefs& torch = torch_refs();
  py::object int64;
  for (const auto& [obj, name] : torch.dtypes) {
    if (name == "int64") int64 = obj;
  }
  py::object t = torch.empty(rows, cols, py::arg("dtype") = int64);
  *data = reinterpret_cast<int64_t*>(call_method(t, torch.data_ptr).cast<uintptr_t>());
  return t;
}

namespace {

const std::vector<std::string> kDense = {"float32", "bfloat16"};

// One decode step of a paged GQA attention layer (freetoken/attention.h) for B sequences;
// returns out [B, H] fp32. Blocking, GIL released, queued behind earlier pool work.
py::object attention_decode(const py::handle& x, const py::handle& qkv_w, const py::handle& o_w,
                            const py::handle& q_norm, const py::handle& k_norm,
                            const py::handle& cos, const py::handle& sin,
                            const py::handle& pool_k, const py::handle& pool_v,
                            const py::handle& kv_slots, const py::handle& kv_offsets,
                            int64_t num_heads, int64_t num_kv_heads, bool gated, double eps,
                            double scale, const py::handle& input_norm, double input_eps,
                            const std::optional<std::string>& isa, const py::handle& qkv_bias,
                            const py::handle& sinks, int64_t window, const py::handle& o_bias) {
  TensorArg xa = check_tensor(x, "x", "[B, H]", 2, kDense);
  const int64_t B = xa.shape[0], H = xa.shape[1];
  std::vector<TensorArg> keep;
  DecodeAttentionProblem p;
  attention_weights(p, xa.dtype, H, qkv_w, o_w, q_norm, k_norm, num_heads, num_kv_heads, gated,
                    eps, scale, input_norm, input_eps, keep, qkv_bias, sinks, window, o_bias);
  TensorArg pk = check_tensor(pool_k, "pool_k", "[slots, nkv, hd]", 3, {xa.dtype});
  TensorArg pv = check_tensor(pool_v, "pool_v", "[slots, nkv, hd]", 3, {xa.dtype});
  if (pk.shape != pv.shape || pk.shape[1] != num_kv_heads || pk.shape[2] != p.head_dim) {
    fail("pool_k " + shape_str(pk.shape) + " / pool_v " + shape_str(pv.shape) +
         " must both be [slots, " + std::to_string(num_kv_heads) + ", " +
         std::to_string(p.head_dim) + "]");
  }
  attention_step(p, B, cos, sin, kv_slots, kv_offsets, keep);
  p.x = xa.data;
  p.pool_k = pk.data;
  p.pool_v = pv.data;
  p.num_slots = pk.shape[0];
  p.isa = resolve_isa(isa);
  return run_on_pool(B, H, [p](float* out, ThreadPool& pool) mutable {
    p.out = out;
    attention_decode(p, pool);
  });
}

// One decode step of a sparse MoE block with resident dense experts (freetoken/moe_block.h);
// returns (out [B, H] fp32 = h + block(h), topk_ids [B, k] int64). Blocking, GIL released.
py::tuple moe_block_decode(const py::handle& h, const py::handle& norm, double eps,
                           const py::handle& router, const py::handle& gate_up,
                           const py::handle& down, const py::handle& shared_gate_up,
                           const py::handle& shared_down, int64_t top_k, bool norm_topk_prob,
                           const std::optional<std::string>& isa, const py::handle& score_bias,
                           int64_t n_group, int64_t topk_group, double routed_scaling,
                           const py::handle& router_bias, const py::object& gate_up_bias,
                           const py::object& down_bias, std::optional<double> swiglu_limit,
                           double swiglu_alpha, const std::optional<std::string>& expert_format,
                           const BlockSize& block_size, const std::string& activations) {
  TensorArg ha = check_tensor(h, "h", "[B, H]", 2, kDense);
  const int64_t B = ha.shape[0], H = ha.shape[1];
  std::vector<TensorArg> keep;
  MoeBlockProblem p;
  const ExpertsArgs experts{py::reinterpret_borrow<py::object>(gate_up),
                           py::reinterpret_borrow<py::object>(down), expert_format, block_size,
                           activations};
  moe_weights(p, ha.dtype, H, norm, eps, router, experts, shared_gate_up, shared_down,
              top_k, norm_topk_prob, keep, score_bias, n_group, topk_group, routed_scaling,
              router_bias, {gate_up_bias, down_bias, swiglu_limit, swiglu_alpha});
  p.batch = B;
  p.h = ha.data;
  p.isa = resolve_isa(isa);
  py::object ids = empty_int64(B, top_k, &p.topk_ids);
  py::object out = run_on_pool(B, H, [p](float* out, ThreadPool& pool) mutable {
    p.out = out;
    moe_block_decode(p, pool);
  });
  return py::make_tuple(out, ids);
}

// One decode step of a Gated DeltaNet layer for B sequences (freetoken/gdn.h); updates each
// sequence's conv / recurrent state in place and returns out [B, H] fp32. Blocking, GIL released.
py::object gdn_decode(const py::handle& x, const py::handle& in_w, const py::handle& conv_w,
                      const py::handle& dt_bias, const py::handle& a_log,
                      const py::handle& norm_w, const py::handle& out_w,
                      const py::list& conv_states, const py::list& recurrent,
                      int64_t num_k_heads, int64_t num_v_heads, double eps,
                      const py::handle& input_norm, double input_eps,
                      const std::optional<std::string>& isa) {
  TensorArg xa = check_tensor(x, "x", "[B, H]", 2, kDense);
  const int64_t B = xa.shape[0], H = xa.shape[1];
  std::vector<TensorArg> keep;
  GdnDecodeProblem p;
  if (static_cast<int64_t>(conv_states.size()) != B ||
      static_cast<int64_t>(recurrent.size()) != B) {
    fail("conv_states and recurrent need one tensor per sequence (" + std::to_string(B) + ")");
  }
  gdn_weights(p, xa.dtype, H, in_w, conv_w, dt_bias, a_log, norm_w, out_w, num_k_heads,
              num_v_heads, eps, input_norm, input_eps, keep);
  gdn_states(p, xa.dtype, B, conv_states, recurrent, p.conv_state, p.recurrent, keep);
  p.batch = B;
  p.x = xa.data;
  p.isa = resolve_isa(isa);
  return run_on_pool(B, H, [p](float* out, ThreadPool& pool) mutable {
    p.out = out;
    gdn_decode(p, pool);
  });
}

}  // namespace

void bind_decode(py::module_& m) {
  m.def("attention_decode", &attention_decode, py::arg("x"), py::arg("qkv_w"), py::arg("o_w"),
        py::arg("q_norm"), py::arg("k_norm"), py::arg("cos"), py::arg("sin"), py::arg("pool_k"),
        py::arg("pool_v"), py::arg("kv_slots"), py::arg("kv_offsets"), py::arg("num_heads"),
        py::arg("num_kv_heads"), py::arg("gated"), py::arg("eps"), py::arg("scale"),
        py::arg("input_norm") = py::none(), py::arg("input_eps") = 1e-6,
        py::arg("isa") = py::none(), py::arg("qkv_bias") = py::none(),
        py::arg("sinks") = py::none(), py::arg("window") = 0, py::arg("o_bias") = py::none(),
        "One decode step of a paged GQA attention layer for B sequences (freetoken/attention.h): "
        "writes the new K/V into pool_k / pool_v, returns the o_proj output [B, H] fp32 (with "
        "input_norm: x is the residual stream h, returns h + o_proj(attention(RMSNorm(h)))).");
  m.def("moe_block_decode", &moe_block_decode, py::arg("h"), py::arg("norm"), py::arg("eps"),
        py::arg("router"), py::arg("gate_up"), py::arg("down"), py::arg("shared_gate_up"),
        py::arg("shared_down"), py::arg("top_k"), py::arg("norm_topk_prob"),
        py::arg("isa") = py::none(), py::arg("score_bias") = py::none(),
        py::arg("n_group") = 1, py::arg("topk_group") = 1, py::arg("routed_scaling") = 1.0,
        py::arg("router_bias") = py::none(), py::arg("gate_up_bias") = py::none(),
        py::arg("down_bias") = py::none(), py::arg("swiglu_limit") = py::none(),
        py::arg("swiglu_alpha") = 1.702, py::arg("expert_format") = py::none(),
        py::arg("block_size") = py::none(), py::arg("activations") = "fp32",
        "One decode step of a sparse MoE block with resident experts, dense or a bank set "
        "(freetoken/moe_block.h): returns (h + block(h) [B, H] fp32, topk_ids [B, k] int64).");
  m.def("gdn_decode", &gdn_decode, py::arg("x"), py::arg("in_w"), py::arg("conv_w"),
        py::arg("dt_bias"), py::arg("a_log"), py::arg("norm_w"), py::arg("out_w"),
        py::arg("conv_states"), py::arg("recurrent"), py::arg("num_k_heads"),
        py::arg("num_v_heads"), py::arg("eps"), py::arg("input_norm") = py::none(),
        py::arg("input_eps") = 1e-6, py::arg("isa") = py::none(),
        "One decode step of a Gated DeltaNet layer for B sequences (freetoken/gdn.h): updates "
        "the conv / recurrent states in place, returns the out_proj output [B, H] fp32 (with "
        "input_norm: x is the residual stream h, returns h + out_proj(...(RMSNorm(h)))).");
}

}  // namespace freetoken::bindings
