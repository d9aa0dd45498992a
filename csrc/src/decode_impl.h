// The vector kernels of a decode step, written once over a 16-lane fp32 vector type V that each
// ISA variant defines with its own intrinsics (decode_<isa>.cpp): the attention core of one
// chunk (freetoken/attention.h AttendArgs) and one gated delta-rule step (freetoken/gdn.h).
// V::zero(), V::broadcast(float), V::load(const float*), V::load_bf16(const uint16_t*) (exact
// widening), V::fma(a, b, acc) = acc + a * b, V::store(float*, v), V::fold(v), which sums the
// lanes pairwise as (l, l + 8), then (l, l + 4), (l, l + 2), (l, l + 1), and
// V::fold16(const V* rows, float* out), out[r] = fold(rows[r]) for 16 rows. Every variant adds
// in the same order; only the rounding of a fused multiply-add differs (the scalar variant
// multiplies and adds separately).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "freetoken/attention.h"
#include "freetoken/gdn.h"

namespace freetoken {
// Internal linkage: every variant keeps its own instantiation.
namespace {

constexpr int64_t kLanes = 16;
// Rows of K / V prefetched ahead: the slots are scattered, so the hardware prefetcher cannot
// follow them; 32 rows (16 KiB of a 512-byte row) measured ~10% faster than 8 at a 16k context
// on a 2-core Zen 4 VM (evals/bench_decode_phases.py, small qwen3_next).
constexpr int64_t kPrefetchAhead = 32;

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

// max(s[0:n]), n >= 1, over kLanes running maxima: the loop vectorises (a maximum is exact in
// any order), where a single running maximum is a serial chain through memory.
inline float row_max(const float* s, int64_t n) {
  float lanes[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lanes[j] = s[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] = s[i + j] > lanes[j] ? s[i + j] : lanes[j];
  }
  float m = s[0];
  for (; i < n; ++i) m = s[i] > m ? s[i] : m;
  for (int64_t j = 0; j < kLanes; ++j) m = lanes[j] > m ? lanes[j] : m;
  return m;
}

// The scores of one position for a tile of T query heads: K row loaded once, T accumulators.
template <class V, int T>
inline void dot_heads(const float* q, int64_t hd, int64_t full, const void* k, bool bf16,
                      int64_t at, V* out, int64_t out_stride) {
  V acc[T];
  for (int t = 0; t < T; ++t) acc[t] = V::zero();
  for (int64_t j = 0; j < full; j += kLanes) {
    const V kv = load_row<V>(k, bf16, at + j);
    for (int t = 0; t < T; ++t) acc[t] = V::fma(V::load(q + t * hd + j), kv, acc[t]);
  }
  for (int t = 0; t < T; ++t) out[t * out_stride] = acc[t];
}

// acc rows [h0, h0 + T), dims [j0, j0 + D * kLanes) = sum over the chunk of the exp scores
// times the V rows of kv head c, in position order (per element, the order of one position at a
// time). prefetch: the first pass over the chunk pulls whole rows ahead.
template <class V, int T, int D>
inline void accumulate_tile(const AttendArgs& a, int64_t c, int64_t h0, int64_t j0,
                            bool prefetch) {
  const int64_t n = a.n, hd = a.head_dim;
  V acc[T][D];
  for (int t = 0; t < T; ++t) {
    for (int d = 0; d < D; ++d) acc[t][d] = V::zero();
  }
  for (int64_t i = 0; i < n; ++i) {
    if (prefetch && i + kPrefetchAhead < n) {
      prefetch_row(a.v, a.bf16, a.slots[i + kPrefetchAhead] * a.slot_stride, a.kv_heads * hd);
    }
    const int64_t at = a.slots[i] * a.slot_stride + c * hd + j0;
    V v[D];
    for (int d = 0; d < D; ++d) v[d] = load_row<V>(a.v, a.bf16, at + d * kLanes);
    for (int t = 0; t < T; ++t) {
      const V s = V::broadcast(a.scores[(h0 + t) * n + i]);
      for (int d = 0; d < D; ++d) acc[t][d] = V::fma(s, v[d], acc[t][d]);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int d = 0; d < D; ++d) V::store(a.acc + (h0 + t) * hd + j0 + d * kLanes, acc[t][d]);
  }
}

constexpr int kHeadTile = 4;  // query heads sharing one K/V row load
constexpr int kDimTile = 4;   // vectors of a V row per accumulation pass (16 accumulators)

// scores [heads, n] = scale * q.k for every query head of the task over the chunk, one pass over
// whole pool rows: blocks of kLanes positions, each (head, position) accumulator kept in parts
// [heads, kLanes] and folded a block at a time.
template <class V>
void score_chunk(const AttendArgs& a, V* parts) {
  const int64_t g = a.group, hd = a.head_dim, n = a.n, full = hd / kLanes * kLanes;
  const int64_t heads = a.kv_heads * g;
  float folded[kLanes];
  for (int64_t i0 = 0; i0 < n; i0 += kLanes) {
    const int64_t count = std::min<int64_t>(kLanes, n - i0);
    for (int64_t p = 0; p < count; ++p) {
      const int64_t i = i0 + p;
      if (i + kPrefetchAhead < n) {
        prefetch_row(a.k, a.bf16, a.slots[i + kPrefetchAhead] * a.slot_stride, a.kv_heads * hd);
      }
      const int64_t row = a.slots[i] * a.slot_stride;
      for (int64_t c = 0; c < a.kv_heads; ++c) {
        for (int64_t h = c * g; h < (c + 1) * g;) {
          const float* q = a.q + h * hd;
          if ((c + 1) * g - h >= kHeadTile) {
            dot_heads<V, kHeadTile>(q, hd, full, a.k, a.bf16, row + c * hd, parts + h * kLanes + p,
                                    kLanes);
            h += kHeadTile;
          } else {
            dot_heads<V, 1>(q, hd, full, a.k, a.bf16, row + c * hd, parts + h * kLanes + p, 0);
            h += 1;
          }
        }
      }
    }
    for (int64_t h = 0; h < heads; ++h) {
      const V* rows = parts + h * kLanes;
      if (count == kLanes) {
        V::fold16(rows, folded);
      } else {
        for (int64_t p = 0; p < count; ++p) folded[p] = V::fold(rows[p]);
      }
      float* out = a.scores + h * n + i0;
      if (full == hd) {  // no tail dims: a loop the compiler vectorises
        for (int64_t p = 0; p < count; ++p) out[p] = folded[p] * a.scale;
        continue;
      }
      const float* q = a.q + h * hd;
      const int64_t c = h / g;
      for (int64_t p = 0; p < count; ++p) {
        float s = folded[p];
        const int64_t at = a.slots[i0 + p] * a.slot_stride + c * hd;
        for (int64_t j = full; j < hd; ++j) s += q[j] * scalar_at(a.k, a.bf16, at + j);
        out[p] = s * a.scale;
      }
    }
  }
}

template <class V>
void attend_chunk_impl(const AttendArgs& a) {
  const int64_t g = a.group, hd = a.head_dim, n = a.n, full = hd / kLanes * kLanes;
  const int64_t heads = a.kv_heads * g;
  thread_local std::vector<V> parts;
  if (static_cast<int64_t>(parts.size()) < heads * kLanes) parts.resize(heads * kLanes);
  score_chunk<V>(a, parts.data());
  for (int64_t h = 0; h < heads; ++h) {
    float* s = a.scores + h * n;
    const float m = row_max(s, n);
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
  for (int64_t c = 0; c < a.kv_heads; ++c) {
    for (int64_t j0 = 0; j0 < full; j0 += kDimTile * kLanes) {
      const bool wide = j0 + kDimTile * kLanes <= full;
      for (int64_t h0 = c * g; h0 < (c + 1) * g; h0 += kHeadTile) {
        const bool first = c == 0 && j0 == 0 && h0 == 0;
        if ((c + 1) * g - h0 >= kHeadTile && wide) {
          accumulate_tile<V, kHeadTile, kDimTile>(a, c, h0, j0, first);
          continue;
        }
        const int64_t tile = std::min<int64_t>(kHeadTile, (c + 1) * g - h0);
        for (int64_t t = 0; t < tile; ++t) {
          for (int64_t j = j0; j < std::min(full, j0 + kDimTile * kLanes); j += kLanes) {
            accumulate_tile<V, 1, 1>(a, c, h0 + t, j, first && t == 0 && j == j0);
          }
        }
      }
    }
    for (int64_t j = full; j < hd; ++j) {
      for (int64_t h = c * g; h < (c + 1) * g; ++h) {
        float acc = 0.0f;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t at = a.slots[i] * a.slot_stride + c * hd + j;
          acc += a.scores[h * n + i] * scalar_at(a.v, a.bf16, at);
        }
        a.acc[h * hd + j] = acc;
      }
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
