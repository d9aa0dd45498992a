// The decode MoE block over the pool (freetoken/moe_block.h), compiled without ISA flags: the
// norm and the routing (softmax, GLM's sigmoid group routing or gpt-oss's biased top-k) run on
// the calling thread (B * (H + E) values), the router, the experts and the shared expert through
// linear_forward / moe_forward, so the whole block is one job.
#include "freetoken/moe_block.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "freetoken/decode_common.h"
#include "freetoken/moe.h"

namespace freetoken {

namespace {

// Sigmoid routing of one token's fp32 logits l [E] (see MoeBlockProblem): the chosen experts in
// descending biased score (ties: lower id) into order[0, K), their weights into w[0, K).
void sigmoid_route(const MoeBlockProblem& p, const float* l, std::vector<float>& scores,
                   std::vector<float>& choice, std::vector<int64_t>& order, float* w) {
  const int64_t E = p.num_experts, K = p.top_k, G = p.n_group, per = E / G;
  for (int64_t e = 0; e < E; ++e) {
    scores[e] = sigmoid(l[e]);
    choice[e] = scores[e] + p.score_bias[e];
  }
  if (p.topk_group < G) {
    std::vector<float> group(G);
    std::vector<int64_t> groups(G);
    for (int64_t g = 0; g < G; ++g) {
      float first = -INFINITY, second = -INFINITY;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > first) {
          second = first;
          first = choice[e];
        } else if (choice[e] > second) {
          second = choice[e];
        }
      }
      group[g] = first + second;
    }
    std::iota(groups.begin(), groups.end(), 0);
    std::partial_sort(groups.begin(), groups.begin() + p.topk_group, groups.end(),
                      [&](int64_t a, int64_t c) {
                        return group[a] > group[c] || (group[a] == group[c] && a < c);
                      });
    std::vector<char> kept_group(G, 0);
    for (int64_t j = 0; j < p.topk_group; ++j) kept_group[groups[j]] = 1;
    for (int64_t e = 0; e < E; ++e) {
      if (!kept_group[e / per]) choice[e] = -INFINITY;
    }
  }
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t c) {
    return choice[a] > choice[c] || (choice[a] == choice[c] && a < c);
  });
  float sum = 0.0f;
  for (int64_t j = 0; j < K; ++j) sum += scores[order[j]];
  for (int64_t j = 0; j < K; ++j) {
    const float s = scores[order[j]];
    w[j] = (p.norm_topk_prob ? s / (sum + 1e-20f) : s) * p.routed_scaling;
  }
}

// gpt-oss routing of one token's logits l [E] (model-dtype values; see MoeBlockProblem): the
// chosen experts in descending biased logit (ties: lower id) into order[0, K), their fp32
// softmax weights into w[0, K). kept rounds a value to the model dtype.
template <typename Kept>
void biased_topk_route(const MoeBlockProblem& p, const float* l, std::vector<float>& choice,
                       std::vector<int64_t>& order, float* w, const Kept& kept) {
  const int64_t E = p.num_experts, K = p.top_k;
  for (int64_t e = 0; e < E; ++e) choice[e] = kept(l[e] + p.router_bias[e]);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t c) {
    return choice[a] > choice[c] || (choice[a] == choice[c] && a < c);
  });
  const float mx = choice[order[0]];
  float sum = 0.0f;
  for (int64_t j = 0; j < K; ++j) sum += w[j] = std::exp(choice[order[j]] - mx);
  for (int64_t j = 0; j < K; ++j) w[j] /= sum;
}

}  // namespace

void moe_block_decode(const MoeBlockProblem& p, ThreadPool& pool) {
  const int64_t B = p.batch, H = p.hidden, E = p.num_experts, K = p.top_k;
  const bool sigmoid_routing = p.score_bias != nullptr;
  const int64_t Is = p.shared_intermediate;
  const int64_t rows = E + (Is > 0 && !sigmoid_routing ? 1 : 0);
  if (B <= 0) return;
  const auto keep = [&](float* v, int64_t n) {
    if (p.bf16) round_to_bf16(v, n);
  };
  const auto kept = [&](float v) { return p.bf16 ? round_to_bf16(v) : v; };

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
  if (sigmoid_routing) {  // fp32 router on the (model-dtype) normed x, logits kept in fp32
    project(x.data(), false, B, H, p.router, rows, false, p.isa, logits.data(), pool);
  } else {
    dense(x.data(), H, p.router, rows, logits.data());
  }

  // the routing weights in the model dtype (softmax routing: over the E routed logits in fp32,
  // the top k, renormalised)
  MoeProblem moe;
  moe.x = x.data();
  moe.num_tokens = B;
  moe.hidden = H;
  moe.intermediate = p.intermediate;
  moe.num_experts = E;
  moe.gate_up = p.gate_up;
  moe.down = p.down;
  moe.activations = p.activations;
  moe.isa = p.isa;
  moe.gate_up_bias = p.gate_up_bias;
  moe.down_bias = p.down_bias;
  moe.swiglu_clamp = p.swiglu_clamp;
  moe.swiglu_limit = p.swiglu_limit;
  moe.swiglu_alpha = p.swiglu_alpha;
  std::vector<float> probs(E), choice(E), weights(K);
  std::vector<int64_t> order(E);
  for (int64_t b = 0; b < B; ++b) {
    const float* l = logits.data() + b * rows;
    if (sigmoid_routing || p.router_bias != nullptr) {
      if (sigmoid_routing) {
        sigmoid_route(p, l, probs, choice, order, weights.data());
      } else {
        biased_topk_route(p, l, choice, order, weights.data(), kept);
      }
      for (int64_t j = 0; j < K; ++j) {
        moe.token_ids.push_back(b);
        moe.expert_ids.push_back(order[j]);
        moe.weights.push_back(kept(weights[j]));
        p.topk_ids[b * K + j] = order[j];
      }
      continue;
    }
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
      if (sigmoid_routing) {  // ungated shared experts
        for (int64_t i = 0; i < H; ++i) {
          float& r = routed[b * H + i];
          r = kept(r + y[b * H + i]);
        }
        continue;
      }
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
