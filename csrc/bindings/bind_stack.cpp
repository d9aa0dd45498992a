// pybind11 glue for the whole-step decode (freetoken/decode_stack.h): DecodeStack checks every
// layer's weights once when it is built and keeps them alive; run() checks the step's tensors
// and runs the step as one blocking job on the process-wide runner, GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "decode_args.h"
#include "freetoken/decode_stack.h"
#include "runner.h"
#include "tensor_arg.h"

namespace freetoken::bindings {

namespace {

[[noreturn]] void fail(const std::string& what) { throw py::value_error(what); }

// Runs check() with "layer <l>: " in front of the message of a TypeError / ValueError it raises.
template <typename Check>
void in_layer(size_t l, const Check& check) {
  const std::string where = "layer " + std::to_string(l) + ": ";
  try {
    check();
  } catch (const py::type_error& e) {
    throw py::type_error(where + e.what());
  } catch (const py::value_error& e) {
    throw py::value_error(where + e.what());
  }
}

class DecodeStackHandle {
 public:
  DecodeStackHandle(const py::handle& embed, const py::handle& final_norm, double final_eps,
                    const py::handle& lm_head, const py::list& layers,
                    const std::optional<std::string>& isa) {
    TensorArg ea = check_tensor(embed, "embed", "[V, H]", 2, {"float32", "bfloat16"});
    dtype_ = ea.dtype;
    const int64_t H = ea.shape[1];
    TensorArg na = check_tensor(final_norm, "final_norm", "[H]", 1, {"float32"});
    TensorArg la = check_tensor(lm_head, "lm_head", "[V, H]", 2, {dtype_});
    if (na.shape[0] != H) fail("final_norm must be [" + std::to_string(H) + "]");
    if (la.shape[1] != H) fail("lm_head " + shape_str(la.shape) + " must be [V, " +
                               std::to_string(H) + "]");
    if (layers.empty()) fail("a decode stack needs at least one layer");
    s_.hidden = H;
    s_.embed_rows = ea.shape[0];
    s_.vocab = la.shape[0];
    s_.bf16 = ea.is_bf16;
    s_.embed = ea.data;
    s_.final_norm = static_cast<const float*>(na.data);
    s_.final_eps = static_cast<float>(final_eps);
    s_.lm_head = la.data;
    s_.isa = resolve_isa(isa);
    for (TensorArg* a : {&ea, &na, &la}) keep_.push_back(std::move(*a));
    for (size_t l = 0; l < layers.size(); ++l) {
      in_layer(l, [&] { add_layer(py::reinterpret_borrow<py::tuple>(layers[l])); });
    }
  }

  // (logits [B, V] fp32, topk_ids [layers, B, k] int64) of one decode step.
  py::tuple run(const py::handle& token_ids, const py::handle& cos, const py::handle& sin,
                const py::handle& pool_k, const py::handle& pool_v, const py::handle& kv_slots,
                const py::handle& kv_offsets, const py::list& conv_states,
                const py::list& recurrent) {
    std::vector<TensorArg> keep;
    TensorArg ids = check_tensor(token_ids, "token_ids", "[B]", 1, {"int64"});
    const int64_t B = ids.shape[0];
    DecodeStackStep st;
    st.batch = B;
    st.token_ids = static_cast<const int64_t*>(ids.data);
    if (pool_layers_ > 0) {
      TensorArg pk = check_tensor(pool_k, "pool_k", "[layers, slots, nkv, hd]", 4, {dtype_});
      TensorArg pv = check_tensor(pool_v, "pool_v", "[layers, slots, nkv, hd]", 4, {dtype_});
      if (pk.shape != pv.shape || pk.shape[0] < pool_layers_ || pk.shape[2] != kv_heads_ ||
          pk.shape[3] != head_dim_) {
        fail("pool_k " + shape_str(pk.shape) + " / pool_v " + shape_str(pv.shape) +
             " must both be [>= " + std::to_string(pool_layers_) + ", slots, " +
             std::to_string(kv_heads_) + ", " + std::to_string(head_dim_) + "]");
      }
      DecodeAttentionProblem p;
      p.head_dim = head_dim_;
      attention_step(p, B, cos, sin, kv_slots, kv_offsets, keep);
      st.cos = p.cos;
      st.sin = p.sin;
      st.rotary_half = p.rotary_half;
      st.kv_slots = p.kv_slots;
      st.kv_offsets = p.kv_offsets;
      st.pool_k = pk.data;
      st.pool_v = pv.data;
      st.num_slots = pk.shape[1];
      keep.push_back(std::move(pk));
      keep.push_back(std::move(pv));
    }
    const size_t gdn = gdn_layers_.size();
    if (conv_states.size() != gdn || recurrent.size() != gdn) {
      fail("conv_states and recurrent need one list per Gated DeltaNet layer (" +
           std::to_string(gdn) + ")");
    }
    st.conv_state.resize(gdn);
    st.recurrent.resize(gdn);
    for (size_t g = 0; g < gdn; ++g) {
      in_layer(gdn_layers_[g], [&] {
        gdn_states(s_.layers[gdn_layers_[g]].gdn, dtype_, B,
                   py::reinterpret_borrow<py::list>(conv_states[g]),
                   py::reinterpret_borrow<py::list>(recurrent[g]), st.conv_state[g],
                   st.recurrent[g], keep);
      });
    }
    const int64_t L = static_cast<int64_t>(s_.layers.size());
    py::object topk = empty_int64(L * B, s_.top_k, &st.topk_ids);
    py::object logits = run_on_pool(B, s_.vocab, [this, st](float* out, ThreadPool& pool) mutable {
      st.logits = out;
      decode_stack_run(s_, st, pool);
      pool.rest();  // the engine's Python and the server's streaming run next
    });
    return py::make_tuple(logits, topk.attr("view")(L, B, s_.top_k));
  }

  int64_t num_layers() const { return static_cast<int64_t>(s_.layers.size()); }

 private:
  // (mixer, mixer_args, moe_args): mixer "attention" with (qkv_w, o_w, q_norm, k_norm,
  // num_heads, num_kv_heads, gated, eps, scale, input_norm, input_eps, pool_layer, qkv_bias,
  // sinks, window, o_bias), or "gdn" with (in_w, conv_w, dt_bias, a_log, norm_w, out_w,
  // num_k_heads, num_v_heads, eps, input_norm, input_eps); moe_args (norm, eps, router, gate_up,
  // down, shared_gate_up, shared_down, top_k, norm_topk_prob, score_bias, n_group, topk_group,
  // routed_scaling, router_bias, gate_up_bias, down_bias, swiglu_limit, swiglu_alpha,
  // expert_format, block_size, activations).
  void add_layer(const py::tuple& spec) {
    if (spec.size() != 3) fail("a layer is (mixer, mixer_args, moe_args)");
    const std::string mixer = spec[0].cast<std::string>();
    const py::tuple a = spec[1].cast<py::tuple>(), m = spec[2].cast<py::tuple>();
    const int64_t H = s_.hidden;
    DecodeStackLayer layer;
    if (mixer == "attention") {
      if (a.size() != 16) fail("attention takes 16 arguments");
      attention_weights(layer.attn, dtype_, H, a[0], a[1], a[2], a[3], a[4].cast<int64_t>(),
                        a[5].cast<int64_t>(), a[6].cast<bool>(), a[7].cast<double>(),
                        a[8].cast<double>(), a[9], a[10].cast<double>(), keep_, a[12], a[13],
                        a[14].cast<int64_t>(), a[15]);
      if (layer.attn.input_norm == nullptr) fail("attention needs its input_norm");
      layer.pool_layer = a[11].cast<int64_t>();
      if (layer.pool_layer < 0) fail("pool_layer must be >= 0");
      if (pool_layers_ > 0 && (layer.attn.num_kv_heads != kv_heads_ ||
                               layer.attn.head_dim != head_dim_)) {
        fail("every attention layer needs the same KV head layout");
      }
      kv_heads_ = layer.attn.num_kv_heads;
      head_dim_ = layer.attn.head_dim;
      pool_layers_ = std::max(pool_layers_, layer.pool_layer + 1);
    } else if (mixer == "gdn") {
      if (a.size() != 11) fail("gdn takes 11 arguments");
      layer.attention = false;
      gdn_weights(layer.gdn, dtype_, H, a[0], a[1], a[2], a[3], a[4], a[5], a[6].cast<int64_t>(),
                  a[7].cast<int64_t>(), a[8].cast<double>(), a[9], a[10].cast<double>(), keep_);
      if (layer.gdn.input_norm == nullptr) fail("gdn needs its input_norm");
      layer.gdn_layer = static_cast<int64_t>(gdn_layers_.size());
      gdn_layers_.push_back(s_.layers.size());
    } else {
      fail("mixer must be 'attention' or 'gdn', got '" + mixer + "'");
    }
    if (m.size() != 21) fail("moe takes 21 arguments");
    const GluArgs glu{py::reinterpret_borrow<py::object>(m[14]),
                      py::reinterpret_borrow<py::object>(m[15]),
                      m[16].cast<std::optional<double>>(), m[17].cast<double>()};
    const ExpertsArgs experts{py::reinterpret_borrow<py::object>(m[3]),
                              py::reinterpret_borrow<py::object>(m[4]),
                              m[18].cast<std::optional<std::string>>(),
                              m[19].cast<BlockSize>(), m[20].cast<std::string>()};
    moe_weights(layer.moe, dtype_, H, m[0], m[1].cast<double>(), m[2], experts, m[5], m[6],
                m[7].cast<int64_t>(), m[8].cast<bool>(), keep_, m[9], m[10].cast<int64_t>(),
                m[11].cast<int64_t>(), m[12].cast<double>(), m[13], glu);
    s_.top_k = std::max(s_.top_k, layer.moe.top_k);  // a dense MLP block routes to 1
    layer.attn.isa = layer.gdn.isa = layer.moe.isa = s_.isa;
    s_.layers.push_back(std::move(layer));
  }

  DecodeStack s_;
  std::string dtype_;
  std::vector<TensorArg> keep_;
  std::vector<size_t> gdn_layers_;  // decoder layer of each Gated DeltaNet layer
  int64_t pool_layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
};

}  // namespace

void bind_stack(py::module_& m) {
  py::class_<DecodeStackHandle>(
      m, "DecodeStack",
      "A whole decode step (embedding, every layer's mixer and MoE block, final norm, lm_head) "
      "in one C++ call (freetoken/decode_stack.h); weights checked and kept when built.")
      .def(py::init<const py::handle&, const py::handle&, double, const py::handle&,
                    const py::list&, const std::optional<std::string>&>(),
           py::arg("embed"), py::arg("final_norm"), py::arg("final_eps"), py::arg("lm_head"),
           py::arg("layers"), py::arg("isa") = py::none())
      .def("run", &DecodeStackHandle::run, py::arg("token_ids"), py::arg("cos"), py::arg("sin"),
           py::arg("pool_k"), py::arg("pool_v"), py::arg("kv_slots"), py::arg("kv_offsets"),
           py::arg("conv_states"), py::arg("recurrent"),
           "One decode step of B sequences: writes their K/V into the pools, updates the "
           "recurrent states, returns (logits [B, V] fp32, topk_ids [layers, B, k] int64).")
      .def_property_readonly("num_layers", &DecodeStackHandle::num_layers);
}

}  // namespace freetoken::bindings
