// One decode step of a sparse MoE block for B tokens on the CPU with resident dense experts:
// the post-attention RMSNorm, the router, softmax top-k routing, the routed SwiGLU experts
// (moe_forward), the optional sigmoid-gated shared expert and the residual add. Sources:
// transformers Qwen3MoeSparseMoeBlock / Qwen3NextSparseMoeBlock and their TopKRouter.
#pragma once

#include <cstdint>

#include "freetoken/isa.h"
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
  const void* gate_up = nullptr;  // [E, 2I, H]
  const void* down = nullptr;     // [E, H, I]
  const void* shared_gate_up = nullptr;  // [2Is, H]
  const void* shared_down = nullptr;     // [H, Is]
  float* out = nullptr;           // [B, H] fp32: h + block(h) (fully overwritten)
  int64_t* topk_ids = nullptr;    // [B, top_k] routed expert ids, probability (sigmoid: biased
                                  // score) descending
  Isa isa = Isa::kScalar;
};

// Runs p on the pool (results do not depend on the thread count).
void moe_block_decode(const MoeBlockProblem& p, ThreadPool& pool);

}  // namespace freetoken
