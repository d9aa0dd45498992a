// The vector kernels of a decode step, written once over a 16-lane fp32 vector type V that each
// ISA variant defines with its own intrinsics (decode_<isa>.cpp): the attention core of one
// chunk (freetoken/attention.h AttendArgs) and one gated delta-rule step (freetoken/gdn.h).
// V::zero(), V::broadcast(float), V::load(const float*), V::load_bf16(const uint16_t*) (exact
// widening), V::fma(a, b, acc) = acc + a * b, V::store(float*, v) and V::fold(v), which sums the
// lanes pairwise as (l, l + 8), then (l, l + 4), (l, l + 2), (l, l + 1). Every variant adds
// in the same order; only the rounding of a fused multiply-add differs (the scalar variant
// multiplies and adds separately).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "freetoken/attention.h"
#include "freetoken/gdn.h"

namespace freetoken {
// Internal linkage: every variant keeps its own instantiation.
namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kPrefetchAhead = 8;  // rows: the slots are scattered, so the hardware
                                       // prefetcher cannot follow them

template <class V>
inline V load_row(const void* base, bool bf16, int64_t at) {
  return bf16 ? V::load_bf16(static_cast<const uint16_t*>(base) + at)
              : V::load(static_cast<const float*>(base) + at);
}

inline float scalar_at(const void* base, bool bf16, int64_t at) {
  if (!bf16) return static_cast<const float*>(base)[at];
  const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[at]) << 16;
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

inline void prefetch_row(const void* base, bool bf16, int64_t at, int64_t n) {
  const char* p = static_cast<const char*>(base) + at * (bf16 ? 2 : 4);
  for (int64_t b = 0; b < n * (bf16 ? 2 : 4); b += 64) __builtin_prefetch(p + b);
}

// exp(x) for x <= 0 within 2 ulp, branch-free so the loop over a chunk's scores vectorises:
// x = n ln2 + r (n = round(x / ln2), ln2 split in two for an exact product), exp(r) from a
// degree-6 polynomial on |r| <= ln2 / 2, times 2^n built in the exponent bits. Below -87 the
// result is clamped at exp(-87) ~ 1.6e-38 (the row maximum contributes exp(0) = 1).
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return e * scale;
}

template <class V>
void attend_chunk_impl(const AttendArgs& a) {
  const int64_t g = a.group, hd = a.head_dim, n = a.n, full = hd / kLanes * kLanes;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) {
      prefetch_row(a.k, a.bf16, a.slots[i + kPrefetchAhead] * a.slot_stride, hd);
    }
    const int64_t at = a.slots[i] * a.slot_stride;
    for (int64_t h = 0; h < g; ++h) {
      const float* q = a.q + h * hd;
      V acc = V::zero();
      for (int64_t j = 0; j < full; j += kLanes) {
        acc = V::fma(V::load(q + j), load_row<V>(a.k, a.bf16, at + j), acc);
      }
      float s = V::fold(acc);
      for (int64_t j = full; j < hd; ++j) s += q[j] * scalar_at(a.k, a.bf16, at + j);
      a.scores[h * n + i] = s * a.scale;
    }
  }
  for (int64_t h = 0; h < g; ++h) {
    float* s = a.scores + h * n;
    float m = s[0];
    for (int64_t i = 1; i < n; ++i) m = s[i] > m ? s[i] : m;
    for (int64_t i = 0; i < n; ++i) s[i] = exp_nonpositive(s[i] - m);
    float lanes[kLanes] = {};  // the sum in the same lane order as the dot products
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) lanes[j] += s[i + j];
    }
    for (int64_t w = kLanes / 2; w >= 1; w /= 2) {
      for (int64_t j = 0; j < w; ++j) lanes[j] += lanes[j + w];
    }
    float l = lanes[0];
    for (; i < n; ++i) l += s[i];
    a.m[h] = m;
    a.l[h] = l;
  }
  std::memset(a.acc, 0, sizeof(float) * g * hd);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) {
      prefetch_row(a.v, a.bf16, a.slots[i + kPrefetchAhead] * a.slot_stride, hd);
    }
    const int64_t at = a.slots[i] * a.slot_stride;
    for (int64_t j = 0; j < full; j += kLanes) {
      const V v = load_row<V>(a.v, a.bf16, at + j);
      for (int64_t h = 0; h < g; ++h) {
        float* acc = a.acc + h * hd + j;
        V::store(acc, V::fma(V::broadcast(a.scores[h * n + i]), v, V::load(acc)));
      }
    }
    for (int64_t j = full; j < hd; ++j) {
      const float v = scalar_at(a.v, a.bf16, at + j);
      for (int64_t h = 0; h < g; ++h) a.acc[h * hd + j] += a.scores[h * n + i] * v;
    }
  }
}

// dst[0:n] = src[0:n] * s (fma with a zero addend rounds like a product), or dst += src * s.
template <class V>
inline void scaled(float* dst, const float* src, float s, int64_t n, bool add) {
  const V sv = V::broadcast(s);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    V::store(dst + j, V::fma(V::load(src + j), sv, add ? V::load(dst + j) : V::zero()));
  }
  for (; j < n; ++j) dst[j] = add ? dst[j] + src[j] * s : src[j] * s;
}

template <class V>
void delta_rule_step_impl(const DeltaRuleArgs& a) {
  const int64_t dk = a.k_dim, dv = a.v_dim;
  float* pred = a.scratch;
  std::memset(pred, 0, sizeof(float) * dv);
  for (int64_t i = 0; i < dk; ++i) {  // S *= decay and pred = S^T k, one pass
    float* row = a.state + i * dv;
    scaled<V>(row, row, a.decay, dv, false);
    scaled<V>(pred, row, a.k[i], dv, true);
  }
  for (int64_t j = 0; j < dv; ++j) pred[j] = (a.v[j] - pred[j]) * a.beta;  // delta
  std::memset(a.out, 0, sizeof(float) * dv);
  for (int64_t i = 0; i < dk; ++i) {  // S += k delta^T and out = S^T q, one pass
    float* row = a.state + i * dv;
    scaled<V>(row, pred, a.k[i], dv, true);
    scaled<V>(a.out, row, a.q[i], dv, true);
  }
}

}  // namespace
}  // namespace freetoken
