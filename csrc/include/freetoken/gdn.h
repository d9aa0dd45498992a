// One decode step of a Gated DeltaNet layer (Qwen3-Next linear attention) for B sequences, one
// new token each, every sequence with its own conv and recurrent state: in_proj, the causal
// depthwise conv (state shifted in place) + SiLU, L2-normalised q (scaled by dk^-0.5) and k,
// beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), the gated delta rule on each value
// head's fp32 state, the gated RMSNorm with z, and out_proj. Source: transformers
// Qwen3NextGatedDeltaNet (recurrent form) and fla's fused_recurrent_gated_delta_rule.
#pragma once

#include <cstdint>
#include <vector>

#include "freetoken/decode_kernels.h"
#include "freetoken/isa.h"
#include "freetoken/thread_pool.h"

namespace freetoken {

struct GdnDecodeProblem {
  int64_t batch = 0;        // B
  int64_t hidden = 0;       // H
  int64_t num_k_heads = 0;  // Hk
  int64_t num_v_heads = 0;  // Hv (a multiple of Hk; v head h reads k head h / (Hv / Hk))
  int64_t k_dim = 0;        // dk
  int64_t v_dim = 0;        // dv
  int64_t conv_kernel = 0;  // K
  // bf16 model: x, the projections, the conv weight and conv state hold bf16 bits, and every
  // value the torch layer keeps in bf16 (projections, conv products and sums, SiLU, sigmoid(b),
  // the delta-rule output, the gated norm) is rounded to bf16; all arithmetic is fp32.
  bool bf16 = false;
  const void* x = nullptr;       // [B, H] normed hidden states, or the residual stream h when
                                 // input_norm is set
  const float* input_norm = nullptr;  // [H] or null: x = RMSNorm(h) first (input_eps), and
  float input_eps = 1e-6f;            // out = h + out_proj(...) in the model dtype
  const void* in_w = nullptr;    // [conv_dim + Hv*dv + 2*Hv, H] rows [q | k | v | z | b | a]
  const void* conv_w = nullptr;  // [conv_dim, K], conv_dim = 2*Hk*dk + Hv*dv
  const float* dt_bias = nullptr;  // [Hv]
  const float* a_log = nullptr;    // [Hv]
  const float* norm_w = nullptr;   // [dv] gated RMSNorm weight
  float eps = 1e-6f;               // gated RMSNorm epsilon
  const void* out_w = nullptr;     // [H, Hv*dv]
  std::vector<void*> conv_state;   // B x [conv_dim, K-1], oldest input first (updated)
  std::vector<float*> recurrent;   // B x [Hv, dk, dv] fp32 S, o = S^T q (updated)
  float* out = nullptr;            // [B, H] fp32 out_proj output, or h + it (fully overwritten)
  Isa isa = Isa::kScalar;
};

void gdn_decode(const GdnDecodeProblem& p, ThreadPool& pool);

// One token of the gated delta rule on one value head, in the order of the torch reference
// (freetoken/ops/gated_delta_rule.py): S *= decay; pred = S^T k; delta = (v - pred) * beta;
// S += k delta^T; out = S^T q. S is [dk, dv] row-major fp32; pred and out sum over dk in row
// order, each column in its own lane.
struct DeltaRuleArgs {
  float* state = nullptr;
  const float* q = nullptr;  // [dk]
  const float* k = nullptr;  // [dk]
  const float* v = nullptr;  // [dv]
  float decay = 1.0f;        // exp(g)
  float beta = 0.0f;
  int64_t k_dim = 0;
  int64_t v_dim = 0;
  float* out = nullptr;      // [dv]
  float* scratch = nullptr;  // [dv]
};

void delta_rule_step_scalar(const DeltaRuleArgs& a);
void delta_rule_step_avx2(const DeltaRuleArgs& a);
void delta_rule_step_avx512(const DeltaRuleArgs& a);

// The delta-rule variants (delta_rule_step_*, reported as "delta_rule_<isa>"); avx512_bf16 runs
// the avx512 one. Counts gdn_decode calls.
const DecodeKernels<DeltaRuleArgs>& delta_rule_kernels();

}  // namespace freetoken
