// Gated DeltaNet decode over the pool (freetoken/gdn.h), compiled without ISA flags: the two
// projections run the rows_dot kernels through linear_forward, the conv runs one task per chunk
// of channels, the q/k norms and gates on the calling thread (a few hundred values), and the
// delta rule with the head's gated RMSNorm one task per (sequence, value head) on the pool.
#include "freetoken/gdn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "freetoken/decode_common.h"

namespace freetoken {

namespace {

float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }  // torch's threshold

constexpr int64_t kConvChunk = 512;  // channels per conv task

}  // namespace

const DecodeKernels<DeltaRuleArgs>& delta_rule_kernels() {
  static const DecodeKernels<DeltaRuleArgs> kernels({
      {&delta_rule_step_scalar, "delta_rule_scalar", Isa::kScalar},
#if defined(__x86_64__) || defined(__i386__)
      {&delta_rule_step_avx2, "delta_rule_avx2", Isa::kAvx2},
      {&delta_rule_step_avx512, "delta_rule_avx512", Isa::kAvx512},
#endif
  });
  return kernels;
}

void gdn_decode(const GdnDecodeProblem& p, ThreadPool& pool) {
  const int64_t B = p.batch, hk = p.num_k_heads, hv = p.num_v_heads, dk = p.k_dim,
                dv = p.v_dim, K = p.conv_kernel;
  if (B <= 0) return;
  const int64_t key_dim = hk * dk, value_dim = hv * dv, conv_dim = 2 * key_dim + value_dim;
  const int64_t rows = conv_dim + value_dim + 2 * hv, ratio = hv / hk;
  const auto kept = [&](float v) { return p.bf16 ? round_to_bf16(v) : v; };

  const bool residual = p.input_norm != nullptr;
  NormedRows normed;
  if (residual) normed = rms_norm_rows(p.x, p.bf16, B, p.hidden, p.input_norm, p.input_eps);
  std::vector<float> proj(B * rows);
  project(residual ? static_cast<const void*>(normed.x.data()) : p.x, p.bf16 && !residual, B,
          p.hidden, p.in_w, rows, p.bf16, p.isa, proj.data(), pool);
  if (p.bf16) round_to_bf16(proj.data(), B * rows);

  // conv + SiLU -> [q | k | v] per sequence, one task per chunk of channels (each channel's
  // taps, state and output its own); then q, k L2-normalised (fp32), beta, decay per v head
  std::vector<float> mixed(B * conv_dim), beta(B * hv), decay(B * hv);
  const int64_t chunks = (conv_dim + kConvChunk - 1) / kConvChunk;
  pool.parallel_for(B * chunks, [&](int64_t task) {
    const int64_t b = task / chunks, c0 = task % chunks * kConvChunk;
    const int64_t n = std::min(conv_dim, c0 + kConvChunk) - c0;
    thread_local std::vector<float> state, taps, window;
    state.resize(n * (K - 1));
    taps.resize(n * K);
    window.resize(K);
    load_values(p.conv_state[b], p.bf16, c0 * (K - 1), n * (K - 1), state.data());
    load_values(p.conv_w, p.bf16, c0 * K, n * K, taps.data());
    const float* row = proj.data() + b * rows + c0;
    float* mix = mixed.data() + b * conv_dim + c0;
    for (int64_t c = 0; c < n; ++c) {
      float* st = state.data() + c * (K - 1);
      const float* w = taps.data() + c * K;
      std::copy(st, st + K - 1, window.begin());
      window[K - 1] = row[c];
      float y = 0.0f;
      for (int64_t t = 0; t < K; ++t) y += kept(w[t] * window[t]);
      mix[c] = kept(silu(kept(y)));
      std::copy(window.begin() + 1, window.end(), st);
    }
    store_values(state.data(), n * (K - 1), p.conv_state[b], p.bf16, c0 * (K - 1));
  });
  for (int64_t b = 0; b < B; ++b) {
    const float* row = proj.data() + b * rows;
    float* mix = mixed.data() + b * conv_dim;
    const float l2_eps = 1e-6f / static_cast<float>(dk);
    const float unit = 1.0f / std::sqrt(static_cast<float>(dk));
    for (int64_t h = 0; h < hk; ++h) {
      float* q = mix + h * dk;
      float* k = mix + key_dim + h * dk;
      rms_norm(q, dk, nullptr, l2_eps, unit * unit, q);  // q: dk^-0.5 (l2) * dk^-0.5 (scale)
      rms_norm(k, dk, nullptr, l2_eps, unit, k);
    }
    const float* gate_b = row + conv_dim + value_dim;
    const float* gate_a = gate_b + hv;
    for (int64_t h = 0; h < hv; ++h) {
      beta[b * hv + h] = kept(sigmoid(gate_b[h]));
      const float g = -std::exp(p.a_log[h]) * softplus(gate_a[h] + p.dt_bias[h]);
      decay[b * hv + h] = std::exp(g);
    }
  }

  std::vector<float> core(B * value_dim), scratch(B * hv * dv);
  const auto step = delta_rule_kernels().use(p.isa);
  pool.parallel_for(B * hv, [&](int64_t task) {
    const int64_t b = task / hv, h = task % hv, kh = h / ratio;
    const float* mix = mixed.data() + b * conv_dim;
    DeltaRuleArgs a;
    a.state = p.recurrent[b] + h * dk * dv;
    a.q = mix + kh * dk;
    a.k = mix + key_dim + kh * dk;
    a.v = mix + 2 * key_dim + h * dv;
    a.decay = decay[b * hv + h];
    a.beta = beta[b * hv + h];
    a.k_dim = dk;
    a.v_dim = dv;
    a.out = core.data() + b * value_dim + h * dv;
    a.scratch = scratch.data() + task * dv;
    step(a);
    // gated RMSNorm of this head: rms_norm(core) * w * silu(z), z from the projection
    const float* z = proj.data() + b * rows + conv_dim + h * dv;
    float* y = a.out;
    for (int64_t j = 0; j < dv; ++j) y[j] = kept(y[j]);
    rms_norm(y, dv, p.norm_w, p.eps, 1.0f, y);
    for (int64_t j = 0; j < dv; ++j) y[j] = kept(y[j] * silu(z[j]));
  });

  project_residual(core.data(), B, value_dim, p.out_w, p.hidden, p.bf16, p.isa,
                   residual ? normed.h.data() : nullptr, p.out, pool);
}

}  // namespace freetoken
