// Argument checks the decode bindings share (bind_decode.cpp, bind_stack.cpp): a layer's weights
// are checked once into its problem struct, the per-step tensors (hidden states, RoPE tables,
// KV slots, recurrent states) on every call. Messages name the argument and the shape expected.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "freetoken/attention.h"
#include "freetoken/gdn.h"
#include "bank_args.h"
#include "freetoken/moe_block.h"
#include "tensor_arg.h"

namespace freetoken::bindings {

// The attention layer's weights and head layout into p (dtype: the model dtype name, hidden:
// H); hd is q_norm's length, or follows from qkv_w's rows when q_norm / k_norm are None (no
// q/k norm). qkv_bias: [rows] fp32 or None; gpt-oss's sinks [nh] fp32, window >= 0 and o_bias
// [H] fp32, or None / 0. Tensors go to keep.
void attention_weights(DecodeAttentionProblem& p, const std::string& dtype, int64_t hidden,
                       const py::handle& qkv_w, const py::handle& o_w, const py::handle& q_norm,
                       const py::handle& k_norm, int64_t num_heads, int64_t num_kv_heads,
                       bool gated, double eps, double scale, const py::handle& input_norm,
                       double input_eps, std::vector<TensorArg>& keep,
                       const py::handle& qkv_bias = py::none(),
                       const py::handle& sinks = py::none(), int64_t window = 0,
                       const py::handle& o_bias = py::none());

// The step's RoPE tables and KV slots of B sequences into p (cos / sin [B, rot / 2] fp32 with
// rot <= head_dim, kv_slots [N] int64, kv_offsets [B + 1] non-decreasing within [0, N]).
void attention_step(DecodeAttentionProblem& p, int64_t batch, const py::handle& cos,
                    const py::handle& sin, const py::handle& kv_slots,
                    const py::handle& kv_offsets, std::vector<TensorArg>& keep);

// The Gated DeltaNet layer's weights and head layout into p.
void gdn_weights(GdnDecodeProblem& p, const std::string& dtype, int64_t hidden,
                 const py::handle& in_w, const py::handle& conv_w, const py::handle& dt_bias,
                 const py::handle& a_log, const py::handle& norm_w, const py::handle& out_w,
                 int64_t num_k_heads, int64_t num_v_heads, double eps,
                 const py::handle& input_norm, double input_eps, std::vector<TensorArg>& keep);

// One conv and one recurrent state per sequence (B of each, p's shapes) into conv / recurrent.
void gdn_states(const GdnDecodeProblem& p, const std::string& dtype, int64_t batch,
                const py::list& conv_states, const py::list& recurrent, std::vector<void*>& conv,
                std::vector<float*>& rec, std::vector<TensorArg>& keep);

// The routed experts of a MoE block as passed from Python: dense tensors in the model dtype
// (format None), or the tuples of a bank set stored in `format` (bank_args.h check_bank; fp8
// with its block_size), and the activations ("fp32", "q8", "bf16") the expert kernel takes.
struct ExpertsArgs {
  py::object gate_up;
  py::object down;
  std::optional<std::string> format;
  BlockSize block_size;
  std::string activations = "fp32";
};

// The MoE block's norm, router and experts into p. score_bias [E] fp32 (not None) selects
// sigmoid group routing (n_group, topk_group, routed_scaling; router fp32 [E, H]); router_bias
// [E] fp32 gpt-oss's biased top-k routing (no shared expert, no score_bias); glu the experts'
// gpt-oss biases and clamped SwiGLU (checked as the expert kernel's, bank_args.h).
void moe_weights(MoeBlockProblem& p, const std::string& dtype, int64_t hidden,
                 const py::handle& norm, double eps, const py::handle& router,
                 const ExpertsArgs& experts, const py::handle& shared_gate_up, const py::handle& shared_down, int64_t top_k,
                 bool norm_topk_prob, std::vector<TensorArg>& keep,
                 const py::handle& score_bias = py::none(), int64_t n_group = 1,
                 int64_t topk_group = 1, double routed_scaling = 1.0,
                 const py::handle& router_bias = py::none(), const GluArgs& glu = GluArgs());

// A new torch int64 tensor [rows, cols] and its data.
py::object empty_int64(int64_t rows, int64_t cols, int64_t** data);

}  // namespace freetoken::bindings
