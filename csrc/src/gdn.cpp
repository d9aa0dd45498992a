// Gated DeltaNet decode over the pool (freetoken/gdn.h), compiled without ISA flags: the two
// projections run the rows_dot kernels through linear_forward, the conv, norms and gates run on
// the calling thread (a few thousand values), and the delta rule runs one task per (sequence,
// value head) on the pool in its ISA variant.
#include "freetoken/gdn.h"

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "freetoken/linear.h"
#include "freetoken/residual.h"

namespace freetoken {

namespace {

std::array<std::atomic<uint64_t>, 3> g_delta_rule_uses{};

const DeltaRuleKernel& delta_rule_for(Isa isa) {
  const auto& all = all_delta_rule_kernels();
  const DeltaRuleKernel* best = &all[0];
  for (const DeltaRuleKernel& k : all) {
    if (static_cast<int>(k.needs) <= static_cast<int>(isa)) best = &k;
  }
  return *best;
}

float silu(float v) { return v / (1.0f + std::exp(-v)); }
float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }  // torch's threshold

// x [n] <- x * rsqrt(mean(x^2) + eps) * scale (F.rms_norm without a weight, times scale).
void rms_scale(float* x, int64_t n, float eps, float scale) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * r * scale;
}

float load_value(const void* base, bool bf16, int64_t at) {
  if (!bf16) return static_cast<const float*>(base)[at];
  const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[at]) << 16;
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

void store_value(void* base, bool bf16, int64_t at, float v) {  // v already a bf16 value if bf16
  if (!bf16) {
    static_cast<float*>(base)[at] = v;
    return;
  }
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  static_cast<uint16_t*>(base)[at] = static_cast<uint16_t>(u >> 16);
}

}  // namespace

const std::vector<DeltaRuleKernel>& all_delta_rule_kernels() {
  static const std::vector<DeltaRuleKernel> kernels = {
      {0, &delta_rule_step_scalar, "delta_rule_scalar", Isa::kScalar},
#if defined(__x86_64__) || defined(__i386__)
      {1, &delta_rule_step_avx2, "delta_rule_avx2", Isa::kAvx2},
      {2, &delta_rule_step_avx512, "delta_rule_avx512", Isa::kAvx512},
#endif
  };
  return kernels;
}

std::vector<uint64_t> delta_rule_use_counts() {
  std::vector<uint64_t> out;
  for (const DeltaRuleKernel& k : all_delta_rule_kernels()) {
    out.push_back(g_delta_rule_uses[k.id].load(std::memory_order_relaxed));
  }
  return out;
}

void gdn_decode(const GdnDecodeProblem& p, ThreadPool& pool) {
  const int64_t B = p.batch, hk = p.num_k_heads, hv = p.num_v_heads, dk = p.k_dim,
                dv = p.v_dim, K = p.conv_kernel;
  if (B <= 0) return;
  const int64_t key_dim = hk * dk, value_dim = hv * dv, conv_dim = 2 * key_dim + value_dim;
  const int64_t rows = conv_dim + value_dim + 2 * hv, ratio = hv / hk;
  const WeightFormat format = p.bf16 ? WeightFormat::kBf16 : WeightFormat::kFp32;
  const auto kept = [&](float v) { return p.bf16 ? round_to_bf16(v) : v; };

  NormedRows normed;
  if (p.input_norm != nullptr) {
    normed = rms_norm_rows(p.x, p.bf16, B, p.hidden, p.input_norm, p.input_eps);
  }
  std::vector<float> proj(B * rows);
  LinearProblem in;
  in.x = p.input_norm != nullptr ? static_cast<const void*>(normed.x.data()) : p.x;
  in.x_is_bf16 = p.bf16 && p.input_norm == nullptr;
  in.rows = B;
  in.in = p.hidden;
  in.out_features = rows;
  in.format = format;
  in.w = p.in_w;
  in.out = proj.data();
  in.isa = p.isa;
  linear_forward(in, pool);
  if (p.bf16) round_to_bf16(proj.data(), B * rows);

  // conv + SiLU -> [q | k | v] per sequence; q, k L2-normalised (fp32); beta, decay per v head
  std::vector<float> mixed(B * conv_dim), beta(B * hv), decay(B * hv);
  std::vector<float> window(K);
  for (int64_t b = 0; b < B; ++b) {
    const float* row = proj.data() + b * rows;
    float* mix = mixed.data() + b * conv_dim;
    void* state = p.conv_state[b];
    for (int64_t c = 0; c < conv_dim; ++c) {
      for (int64_t t = 0; t < K - 1; ++t) window[t] = load_value(state, p.bf16, c * (K - 1) + t);
      window[K - 1] = row[c];
      float y = 0.0f;
      for (int64_t t = 0; t < K; ++t) {
        y += kept(load_value(p.conv_w, p.bf16, c * K + t) * window[t]);
      }
      mix[c] = kept(silu(kept(y)));
      for (int64_t t = 0; t < K - 1; ++t) store_value(state, p.bf16, c * (K - 1) + t, window[t + 1]);
    }
    const float l2_eps = 1e-6f / static_cast<float>(dk);
    const float unit = 1.0f / std::sqrt(static_cast<float>(dk));
    for (int64_t h = 0; h < hk; ++h) {
      rms_scale(mix + h * dk, dk, l2_eps, unit * unit);                // q: dk^-0.5 * dk^-0.5
      rms_scale(mix + key_dim + h * dk, dk, l2_eps, unit);             // k
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
  const DeltaRuleKernel& kernel = delta_rule_for(p.isa);
  g_delta_rule_uses[kernel.id].fetch_add(1, std::memory_order_relaxed);
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
    kernel.fn(a);
  });

  // gated RMSNorm: rms_norm(core) * w * silu(z), z from the projection
  for (int64_t b = 0; b < B; ++b) {
    const float* z = proj.data() + b * rows + conv_dim;
    for (int64_t h = 0; h < hv; ++h) {
      float* y = core.data() + b * value_dim + h * dv;
      for (int64_t j = 0; j < dv; ++j) y[j] = kept(y[j]);
      float ss = 0.0f;
      for (int64_t j = 0; j < dv; ++j) ss += y[j] * y[j];
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(dv) + p.eps);
      for (int64_t j = 0; j < dv; ++j) {
        y[j] = kept(y[j] * r * p.norm_w[j] * silu(z[h * dv + j]));
      }
    }
  }
  LinearProblem o;
  o.x = core.data();
  o.rows = B;
  o.in = value_dim;
  o.out_features = p.hidden;
  o.format = format;
  o.w = p.out_w;
  o.isa = p.isa;
  project_residual(o, p.input_norm != nullptr ? normed.h.data() : nullptr, p.bf16, p.out, pool);
}

}  // namespace freetoken
