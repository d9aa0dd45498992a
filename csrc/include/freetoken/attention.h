// One decode step of a GQA attention layer for B sequences (one new token each) whose K/V live in
// a shared paged pool: the fused q/k/v projection, per-head q/k RMSNorm, RoPE (NeoX half form,
// partial rotary), the new K/V written into the pool at each sequence's new slot, attention of
// each query head over its sequence's slots read in place (no gather), the optional Qwen3-Next
// output gate and o_proj. gpt-oss adds per-head sink logits, a sliding window and an o_proj
// bias. Sources: transformers Qwen3MoeAttention / Qwen3NextAttention / GptOssAttention.
#pragma once

#include <cstdint>
#include <vector>

#include "freetoken/decode_kernels.h"
#include "freetoken/isa.h"
#include "freetoken/thread_pool.h"

namespace freetoken {

struct DecodeAttentionProblem {
  int64_t batch = 0;         // B sequences
  int64_t hidden = 0;        // H
  int64_t num_heads = 0;     // nh query heads
  int64_t num_kv_heads = 0;  // nkv (nh a multiple of it)
  int64_t head_dim = 0;      // hd
  int64_t rotary_half = 0;   // rot / 2: dims [0, rot) rotate, [rot, hd) pass through
  bool gated = false;        // q rows are [q (nh*hd) | gate (nh*hd)], out *= sigmoid(gate)
  // bf16 model: x, the weights and the pool hold bf16 bits, and every value the torch layer
  // stores in the model dtype (the projections, normed q/k, rotated q/k, attention output, gated
  // output) is rounded to bf16 (round to nearest even); all arithmetic is fp32. Else all fp32.
  bool bf16 = false;
  const void* x = nullptr;      // [B, H] normed hidden states, or the residual stream h when
                                // input_norm is set
  const float* input_norm = nullptr;  // [H] or null: x = RMSNorm(h) first (input_eps), and
  float input_eps = 1e-6f;            // out = h + o_proj(...) in the model dtype
  const void* qkv_w = nullptr;  // [q_rows + 2 * nkv * hd, H], q_rows = nh * hd * (gated ? 2 : 1)
  const void* o_w = nullptr;    // [H, nh * hd]
  const float* qkv_bias = nullptr;  // [rows] or null: added to the projection (GLM q/k/v bias;
                                    // values of the model dtype, the sum rounded like it)
  const float* q_norm = nullptr;  // [hd] RMSNorm multiplier of q (already 1 + w when zero-centred),
                                  // or null with k_norm: no q/k norm (GLM without use_qk_norm)
  const float* k_norm = nullptr;  // [hd] of k
  float eps = 1e-6f;
  float scale = 1.0f;            // softmax scale (hd ** -0.5)
  // gpt-oss sinks: query head h's softmax gets one more logit s_h that takes probability mass
  // and no value, P = exp(scores) / (sum exp(scores) + exp(s_h)); the maximum the merge rescales
  // to includes s_h. Null: plain softmax.
  const float* sinks = nullptr;  // [nh] fp32 or null
  // > 0: a sequence of n slots attends only to its last min(n, window) slots (the new token's
  // included: key j visible from position p iff p - window < j <= p); 0: to all of them.
  int64_t window = 0;
  const float* o_bias = nullptr;  // [H] or null: added to o_proj's output (rounded like qkv_bias)
  const float* cos = nullptr;    // [B, rot / 2] at each sequence's new position
  const float* sin = nullptr;    // [B, rot / 2]
  void* pool_k = nullptr;        // [num_slots, nkv, hd] this layer's K rows (model dtype)
  void* pool_v = nullptr;        // [num_slots, nkv, hd]
  int64_t num_slots = 0;
  const int64_t* kv_slots = nullptr;    // the sequences' slots, position order, concatenated
  const int64_t* kv_offsets = nullptr;  // [B + 1]: sequence b owns kv_slots[off[b], off[b+1]);
                                        // its last slot receives the new token's K/V
  float* out = nullptr;  // [B, H] fp32 o_proj output (+ o_bias), or h + it (fully overwritten)
  Isa isa = Isa::kScalar;
};

// Runs p on the pool. The result does not depend on the thread count: positions are split into
// fixed chunks of kAttendChunk whose partial softmax sums merge in chunk order. Throws
// std::invalid_argument for a slot outside the pool or an empty sequence.
void attention_decode(const DecodeAttentionProblem& p, ThreadPool& pool);

// Throws std::invalid_argument ("<op>: ...") unless each of the batch sequences owns at least
// one slot in kv_slots[kv_offsets[b], kv_offsets[b+1]) and every slot lies in [0, num_slots).
void check_kv_slots(const char* op, int64_t batch, const int64_t* kv_slots,
                    const int64_t* kv_offsets, int64_t num_slots);

constexpr int64_t kAttendChunk = 256;

// One (sequence, run of kv heads, chunk of positions) of the attention core: for each of the
// kv_heads kv heads and its `group` query heads q [kv_heads * group, hd] (fp32, head h of kv
// head c at row c * group + h) against the n K/V rows at base + slots[i] * slot_stride
// (+ c * head_dim), writes per query head the chunk's row maximum m of scale * q.k,
// l = sum exp(s - m) and the unnormalised acc [hd] = sum exp(s - m) * v ([kv_heads * group]
// rows each). A task over several kv heads reads whole pool rows, one stream. Dot products sum
// in 16 interleaved lanes (then a fixed pairwise tree), the same order on every variant; a head's
// result does not depend on how many kv heads share its task. scores: scratch [kv_heads *
// group, n].
struct AttendArgs {
  const float* q = nullptr;
  int64_t group = 0;
  int64_t kv_heads = 1;
  int64_t head_dim = 0;
  const void* k = nullptr;  // pool base already offset to the first kv head
  const void* v = nullptr;
  bool bf16 = false;
  int64_t slot_stride = 0;  // elements from one slot's row to the next (nkv * hd)
  const int64_t* slots = nullptr;
  int64_t n = 0;
  float scale = 1.0f;
  float* scores = nullptr;
  float* m = nullptr;
  float* l = nullptr;
  float* acc = nullptr;
};

void attend_chunk_scalar(const AttendArgs& a);
void attend_chunk_avx2(const AttendArgs& a);    // AVX2 + FMA build of the same code
void attend_chunk_avx512(const AttendArgs& a);  // AVX-512F build of the same code

// The attention core variants (attend_chunk_*, reported as "attend_<isa>"); avx512_bf16 runs
// attend_avx512. Counts attention_decode calls.
const DecodeKernels<AttendArgs>& attend_kernels();

}  // namespace freetoken
