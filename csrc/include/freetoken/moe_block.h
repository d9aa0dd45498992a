// One decode step of a sparse MoE block for B tokens on the CPU with resident experts (dense in
// the model dtype, or a bank set in any WeightFormat, moe.h):
// the post-attention RMSNorm, the router, softmax top-k routing (or GLM's sigmoid group routing,
// or gpt-oss's biased top-k), the routed SwiGLU experts (moe_forward, with gpt-oss's biases and
// clamped activation when given), the optional shared expert and the residual add. Sources:
// transformers Qwen3MoeSparseMoeBlock / Qwen3NextSparseMoeBlock / Glm4MoeMoE / GptOssMLP and
// their routers.
#pragma once

#include <cstdint>

#include "freetoken/isa.h"
#include "freetoken/moe.h"
#include "freetoken/thread_pool.h"

namespace freetoken {

struct MoeBlockProblem {
  int64_t batch = 0;          // B tokens
  int64_t hidden = 0;         // H
  int64_t num_experts = 0;    // E
  int64_t intermediate = 0;   // I of a routed expert
  int64_t shared_intermediate = 0;  // Is, 0 without a shared expert
  int64_t top_k = 0;
  bool norm_topk_prob = true;  // renormalise the k probabilities to sum to 1
  // bf16 model: h and every weight hold bf16 bits, and each value the torch block keeps in bf16
  // (normed x, router logits, routing weights, routed output, shared expert's projections and
  // silu(g) * u, the gate, the sums) is rounded to bf16; all arithmetic is fp32. Else all fp32.
  bool bf16 = false;
  const void* h = nullptr;        // [B, H] residual stream
  const float* norm = nullptr;    // [H] RMSNorm multiplier (already 1 + w when zero-centred)
  float eps = 1e-6f;
  const void* router = nullptr;   // [E (+1 with a shared expert: its gate row last), H]; with
                                  // sigmoid routing fp32 [E, H] whatever the model dtype
  // Sigmoid routing (GLM-4.5, transformers Glm4MoeTopkRouter), selected by score_bias: fp32
  // logits (not rounded), scores = sigmoid(logits); experts chosen by scores + score_bias among
  // the topk_group best of n_group groups (a group scores by its two best biased scores), their
  // weights the unbiased scores, renormalised (+ 1e-20) when norm_topk_prob, times
  // routed_scaling. The shared expert is then added without a gate.
  const float* score_bias = nullptr;  // [E] or null (softmax routing)
  int64_t n_group = 1;
  int64_t topk_group = 1;
  float routed_scaling = 1.0f;
  // gpt-oss routing (transformers GptOssTopKRouter), selected by router_bias: logits in the
  // model dtype plus router_bias (the sum rounded like it), the top_k biased logits chosen
  // (ties: lower id), their softmax over those k the weights (rounded; norm_topk_prob unused).
  // No shared expert.
  const float* router_bias = nullptr;  // [E] fp32 holding model-dtype values, or null
  // gpt-oss experts (moe.h MoeProblem): biases and the clamped SwiGLU, whatever the routing.
  const float* gate_up_bias = nullptr;  // [E, 2I] fp32 or null
  const float* down_bias = nullptr;     // [E, H] fp32 or null
  bool swiglu_clamp = false;
  float swiglu_limit = 0.0f;
  float swiglu_alpha = 1.702f;
  // The routed experts [E, 2I, H] / [E, H, I] (moe.h WeightBank): dense banks in the model
  // dtype, or quantised ones (mxfp4, q4g, fp8, nvfp4) read as stored. activations: what x and
  // silu(g) * u enter them as (moe.h MoeProblem::activations; kQ8 needs 4-bit banks, kBf16 bf16
  // ones, fp8 / nvfp4 take kFp32 only).
  WeightBank gate_up;
  WeightBank down;
  Activations activations = Activations::kFp32;
  const void* shared_gate_up = nullptr;  // [2Is, H]
  const void* shared_down = nullptr;     // [H, Is]
  float* out = nullptr;           // [B, H] fp32: h + block(h) (fully overwritten)
  int64_t* topk_ids = nullptr;    // [B, top_k] routed expert ids, probability (sigmoid: biased
                                  // score; gpt-oss: biased logit) descending
  Isa isa = Isa::kScalar;
};

// Runs p on the pool (results do not depend on the thread count).
void moe_block_decode(const MoeBlockProblem& p, ThreadPool& pool);

}  // namespace freetoken
