// The decode MoE block over the pool (freetoken/moe_block.h), compiled without ISA flags: the
// norm and the routing run on the calling thread (B * (H + E) values), the router, the experts
// and the shared expert through linear_forward / moe_forward, so the whole block is one job.
#include "freetoken/moe_block.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "freetoken/decode_common.h"
#include "freetoken/moe.h"

namespace freetoken {

void moe_block_decode(const MoeBlockProblem& p, ThreadPool& pool) {
  const int64_t B = p.batch, H = p.hidden, E = p.num_experts, K = p.top_k;
  const int64_t Is = p.shared_intermediate, rows = E + (Is > 0 ? 1 : 0);
  if (B <= 0) return;
  const auto keep = [&](float* v, int64_t n) {
    if (p.bf16) round_to_bf16(v, n);
  };
  const auto kept = [&](float v) { return p.bf16 ? round_to_bf16(v) : v; };
  const WeightFormat format = p.bf16 ? WeightFormat::kBf16 : WeightFormat::kFp32;

  // residual stream as fp32, and x = RMSNorm(h) in the model dtype
  const NormedRows normed = rms_norm_rows(p.h, p.bf16, B, H, p.norm, p.eps);
  const std::vector<float>& h = normed.h;
  const std::vector<float>& x = normed.x;

  // x [B, cols] @ w^T, the result in the model dtype (F.linear's output)
  const auto dense = [&](const float* in, int64_t cols, const void* w, int64_t out_rows,
                         float* out) {
    project(in, false, B, cols, w, out_rows, p.bf16, p.isa, out, pool);
    keep(out, B * out_rows);
  };
  std::vector<float> logits(B * rows);
  dense(x.data(), H, p.router, rows, logits.data());

  // softmax over the E routed logits in fp32, the top k, renormalised, in the model dtype
  MoeProblem moe;
  moe.x = x.data();
  moe.num_tokens = B;
  moe.hidden = H;
  moe.intermediate = p.intermediate;
  moe.num_experts = E;
  moe.gate_up.format = format;
  moe.gate_up.values = p.gate_up;
  moe.down.format = format;
  moe.down.values = p.down;
  moe.isa = p.isa;
  std::vector<float> probs(E);
  std::vector<int64_t> order(E);
  for (int64_t b = 0; b < B; ++b) {
    const float* l = logits.data() + b * rows;
    const float mx = *std::max_element(l, l + E);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += probs[e] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) probs[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t c) {
      return probs[a] > probs[c] || (probs[a] == probs[c] && a < c);
    });
    float top = 0.0f;
    for (int64_t j = 0; j < K; ++j) top += probs[order[j]];
    for (int64_t j = 0; j < K; ++j) {
      const float w = p.norm_topk_prob ? probs[order[j]] / top : probs[order[j]];
      moe.token_ids.push_back(b);
      moe.expert_ids.push_back(order[j]);
      moe.weights.push_back(kept(w));
      p.topk_ids[b * K + j] = order[j];
    }
  }
  std::vector<float> routed(B * H);
  moe.out = routed.data();
  moe_forward(moe, pool);
  keep(routed.data(), B * H);

  if (Is > 0) {
    std::vector<float> gu(B * 2 * Is), act(B * Is), y(B * H);
    dense(x.data(), H, p.shared_gate_up, 2 * Is, gu.data());
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < Is; ++j) {
        act[b * Is + j] = kept(kept(silu(gu[b * 2 * Is + j])) * gu[b * 2 * Is + Is + j]);
      }
    }
    dense(act.data(), Is, p.shared_down, H, y.data());
    for (int64_t b = 0; b < B; ++b) {
      const float gate = kept(sigmoid(logits[b * rows + E]));
      for (int64_t i = 0; i < H; ++i) {
        float& r = routed[b * H + i];
        r = kept(r + kept(gate * y[b * H + i]));
      }
    }
  }
  residual_add(h.data(), routed.data(), p.bf16, p.out, B * H);
}

}  // namespace freetoken
