// A whole decode step of a MoE decoder on the CPU in one call: the token embedding, every
// layer's mixer (paged GQA attention or Gated DeltaNet) and sparse MoE block, each with its
// pre-norm and residual add, then the final RMSNorm and the lm_head. Each layer runs exactly the
// per-layer decode ops (attention.h, gdn.h, moe_block.h) in order, the residual stream kept in
// the model dtype between them, so the step's result equals calling those ops one by one.
// gpt-oss's layers (sinks, windows, biases, biased routing) are fields of those ops' problems.
// Sources: transformers Qwen3MoeModel / Qwen3NextModel / GptOssModel decoder loop.
#pragma once

#include <cstdint>
#include <vector>

#include "freetoken/attention.h"
#include "freetoken/gdn.h"
#include "freetoken/isa.h"
#include "freetoken/moe_block.h"
#include "freetoken/thread_pool.h"

namespace freetoken {

struct DecodeStackLayer {
  bool attention = true;  // mixer: paged attention (attn) or Gated DeltaNet (gdn)
  // The mixer's weights, head layout and input norm; run() fills the per-step fields (batch,
  // x, out, and cos / sin / pool / slots or the recurrent states).
  DecodeAttentionProblem attn;
  int64_t pool_layer = 0;  // attention: this layer's index in the KV pool
  GdnDecodeProblem gdn;
  int64_t gdn_layer = 0;   // Gated DeltaNet: index into DecodeStackStep's state lists
  MoeBlockProblem moe;     // the MoE block's weights and post-attention norm
};

struct DecodeStack {
  int64_t hidden = 0;      // H
  int64_t embed_rows = 0;  // rows of the embedding table (valid token ids)
  int64_t vocab = 0;       // V, rows of the lm_head
  int64_t top_k = 0;       // the largest top_k of the blocks (a dense MLP block has 1)
  bool bf16 = false;       // the model dtype of every weight and of the residual stream
  const void* embed = nullptr;       // [embed_rows, H]
  const float* final_norm = nullptr;  // [H] fp32 multiplier of the final RMSNorm
  float final_eps = 1e-6f;
  const void* lm_head = nullptr;     // [V, H]
  std::vector<DecodeStackLayer> layers;
  Isa isa = Isa::kScalar;
};

struct DecodeStackStep {
  int64_t batch = 0;                 // B sequences, one new token each
  const int64_t* token_ids = nullptr;  // [B]
  const float* cos = nullptr;        // [B, rot / 2] at each sequence's new position
  const float* sin = nullptr;
  int64_t rotary_half = 0;
  void* pool_k = nullptr;            // [attention layers, num_slots, nkv, hd] (model dtype)
  void* pool_v = nullptr;
  int64_t num_slots = 0;
  const int64_t* kv_slots = nullptr;    // as DecodeAttentionProblem, shared by every layer
  const int64_t* kv_offsets = nullptr;  // [B + 1]
  std::vector<std::vector<void*>> conv_state;  // [GDN layer][b] as GdnDecodeProblem
  std::vector<std::vector<float*>> recurrent;  // [GDN layer][b]
  int64_t* topk_ids = nullptr;       // [layers, B, top_k] routed expert ids of every MoE block
  float* logits = nullptr;           // [B, V] fp32 (rounded to bf16 values for a bf16 model)
};

// Runs the step on the pool. Every token id, KV slot and offset is checked before any state is
// written (std::invalid_argument, nothing changed); the K/V of the new tokens are written into
// the pool and the recurrent states updated in place, as the per-layer ops do.
void decode_stack_run(const DecodeStack& stack, const DecodeStackStep& step, ThreadPool& pool);

}  // namespace freetoken
