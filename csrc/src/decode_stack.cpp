// freetoken/decode_stack.h (compiled without ISA flags): the per-layer decode ops in sequence
// over one residual-stream buffer in the model dtype, then the final norm and the lm_head.
#include "freetoken/decode_stack.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "freetoken/decode_common.h"

namespace freetoken {

namespace {

void check_step(const DecodeStack& s, const DecodeStackStep& st) {
  const int64_t B = st.batch;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t id = st.token_ids[b];
    if (id < 0 || id >= s.embed_rows) {
      throw std::invalid_argument("decode_stack: token id " + std::to_string(id) +
                                  " outside the embedding's " + std::to_string(s.embed_rows) +
                                  " rows");
    }
  }
  bool attention = false;
  for (const auto& layer : s.layers) attention = attention || layer.attention;
  if (attention) check_kv_slots("decode_stack", B, st.kv_slots, st.kv_offsets, st.num_slots);
}

}  // namespace

void decode_stack_run(const DecodeStack& s, const DecodeStackStep& st, ThreadPool& pool) {
  const int64_t B = st.batch, H = s.hidden;
  if (B <= 0) return;
  check_step(s, st);
  const size_t width = s.bf16 ? sizeof(uint16_t) : sizeof(float);
  std::vector<unsigned char> h(B * H * width);  // the residual stream in the model dtype
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(h.data() + b * H * width,
                static_cast<const unsigned char*>(s.embed) + st.token_ids[b] * H * width,
                H * width);
  }
  std::vector<float> out(B * H);
  // out holds values already in the model dtype (the ops round where the torch layer does)
  const auto keep_out = [&] { store_values(out.data(), B * H, h.data(), s.bf16, 0); };
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const DecodeStackLayer& layer = s.layers[l];
    if (layer.attention) {
      DecodeAttentionProblem p = layer.attn;
      const int64_t per_layer = st.num_slots * p.num_kv_heads * p.head_dim;
      p.batch = B;
      p.x = h.data();
      p.cos = st.cos;
      p.sin = st.sin;
      p.rotary_half = st.rotary_half;
      p.pool_k = static_cast<unsigned char*>(st.pool_k) + layer.pool_layer * per_layer * width;
      p.pool_v = static_cast<unsigned char*>(st.pool_v) + layer.pool_layer * per_layer * width;
      p.num_slots = st.num_slots;
      p.kv_slots = st.kv_slots;
      p.kv_offsets = st.kv_offsets;
      p.out = out.data();
      attention_decode(p, pool);
    } else {
      GdnDecodeProblem p = layer.gdn;
      p.batch = B;
      p.x = h.data();
      p.conv_state = st.conv_state[layer.gdn_layer];
      p.recurrent = st.recurrent[layer.gdn_layer];
      p.out = out.data();
      gdn_decode(p, pool);
    }
    keep_out();
    MoeBlockProblem m = layer.moe;
    m.batch = B;
    m.h = h.data();
    m.out = out.data();
    m.topk_ids = st.topk_ids + static_cast<int64_t>(l) * B * s.top_k;
    moe_block_decode(m, pool);
    keep_out();
  }
  const NormedRows normed = rms_norm_rows(h.data(), s.bf16, B, H, s.final_norm, s.final_eps);
  project(normed.x.data(), false, B, H, s.lm_head, s.vocab, s.bf16, s.isa, st.logits, pool);
  if (s.bf16) round_to_bf16(st.logits, B * s.vocab);
}

}  // namespace freetoken
