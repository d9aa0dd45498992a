// AVX512_BF16 variant of rows_dot for bf16 weights and bf16 activations (Activations::kBf16):
// vdpbf16ps accumulates pairs of bf16 products into fp32 lanes, 32 weights per instruction. The
// vectors hold values that moe.cpp already rounded to bf16 (so vcvtne2ps2bf16 is exact), in
// column order (VecLayout::kNatural); bf16 x bf16 products are exact in fp32, so only the fp32
// additions round (and vdpbf16ps flushes denormal inputs and outputs to zero). Like the AVX2
// tiles, each tile prefetches the next row block (same columns, RB rows further) while it reads
// its own rows. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 (see setup_ext.py);
// called only when the CPU reports all four.
// NOTE: no shared inline/template symbols here (see rows_dot_avx2.cpp).
// NOTE: GCC 12 warns (-Wuninitialized) inside its own avx512fintrin.h on _mm256_undefined_*().
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "freetoken/isa.h"

namespace freetoken {

namespace {

inline __m512bh load32_bf16(const uint16_t* p, __mmask32 m) {
  return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
}

inline __m512bh load32_f32_as_bf16(const float* p, __mmask32 m) {
  __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m), p);
  __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m >> 16), p + 16);
  return _mm512_cvtne2ps_pbh(hi, lo);
}

// Sum of the 16 lanes.
inline float hsum16(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // swap 256-bit halves
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // swap 128-bit quarters
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));        // swap pairs within 128 bits
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));        // swap neighbours
  return _mm512_cvtss_f32(v);
}

inline __mmask32 first_lanes(int64_t n) {
  return n >= 32 ? __mmask32(0xFFFFFFFFu) : n <= 0 ? __mmask32(0) : __mmask32((1u << n) - 1u);
}

// The call's vectors as bf16 once (not once per row block): num_vecs rows of kp columns (k
// rounded up to 32, zero padded), exact for the bf16 values the callers pass.
inline const uint16_t* bf16_vectors(const RowsDotArgs& a, int64_t kp) {
  thread_local std::vector<uint16_t> buf;
  if (buf.size() < static_cast<size_t>(a.num_vecs * kp)) buf.resize(a.num_vecs * kp);
  for (int64_t t = 0; t < a.num_vecs; ++t) {
    uint16_t* dst = buf.data() + t * kp;
    for (int64_t k = 0; k < kp; k += 32) {
      _mm512_storeu_si512(dst + k, (__m512i)load32_f32_as_bf16(a.vecs[t] + k,
                                                               first_lanes(a.k - k)));
    }
  }
  return buf.data();
}

inline __m512bh load32(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

// One row against TB (1 or 2) vectors, the row read as one sequential stream (no software
// prefetch; see rows_dot_avx512.cpp): NA = 4 / TB accumulators per vector over consecutive
// 32-column steps hide the vdpbf16ps latency.
template <int TB>
inline void row_stream(const RowsDotArgs& a, int64_t r, const uint16_t* vecs, int64_t kp) {
  constexpr int NA = 4 / TB;
  constexpr int64_t kStep = 32 * NA;
  __m512 acc[TB][NA];
  for (int t = 0; t < TB; ++t)
    for (int n = 0; n < NA; ++n) acc[t][n] = _mm512_setzero_ps();
  const uint16_t* w = static_cast<const uint16_t*>(a.w) + r * a.k;
  const int64_t full = a.k / kStep * kStep;
  int64_t k = 0;
  for (; k < full; k += kStep) {
    for (int n = 0; n < NA; ++n) {
      const __m512bh wv = load32(w + k + 32 * n);
      for (int t = 0; t < TB; ++t) {
        acc[t][n] = _mm512_dpbf16_ps(acc[t][n], wv, load32(vecs + t * kp + k + 32 * n));
      }
    }
  }
  for (; k < a.k; k += 32) {  // the last steps, masked past the row
    const __m512bh wv = load32_bf16(w + k, first_lanes(a.k - k));
    for (int t = 0; t < TB; ++t) acc[t][0] = _mm512_dpbf16_ps(acc[t][0], wv, load32(vecs + t * kp + k));
  }
  for (int t = 0; t < TB; ++t) {
    __m512 sum = acc[t][0];
    for (int n = 1; n < NA; ++n) sum = _mm512_add_ps(sum, acc[t][n]);
    a.out[t * a.out_stride + (r - a.row_begin)] = hsum16(sum);
  }
}

// RB rows x TB vectors: RB*TB zmm accumulators over the full reduction (masked tail); each
// step prefetches the next row block (same columns, RB rows further).
template <int RB, int TB>
inline void tile(const RowsDotArgs& a, int64_t r0, int64_t i0, const uint16_t* vecs,
                 int64_t kp) {
  __m512 acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint16_t* rows[RB];
  for (int r = 0; r < RB; ++r) rows[r] = static_cast<const uint16_t*>(a.w) + (r0 + r) * a.k;
  const int64_t ahead = RB * a.k;
  const uint16_t* v[TB];
  for (int t = 0; t < TB; ++t) v[t] = vecs + (i0 + t) * kp;
  for (int64_t k = 0; k < a.k; k += 32) {
    const __mmask32 m = first_lanes(a.k - k);
    __m512bh x[TB];
    for (int t = 0; t < TB; ++t) x[t] = load32(v[t] + k);
    for (int r = 0; r < RB; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + k), _MM_HINT_T0);  // 64 bytes
      const __m512bh w = load32_bf16(rows[r] + k, m);
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w, x[t]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t)
      a.out[(i0 + t) * a.out_stride + (r0 + r - a.row_begin)] = hsum16(acc[r][t]);
}

template <int RB>
inline void row_block(const RowsDotArgs& a, int64_t r0, const uint16_t* vecs, int64_t kp) {
  int64_t i = 0;
  for (; i + 4 <= a.num_vecs; i += 4) tile<RB, 4>(a, r0, i, vecs, kp);
  switch (a.num_vecs - i) {
    case 3: tile<RB, 3>(a, r0, i, vecs, kp); break;
    case 2: tile<RB, 2>(a, r0, i, vecs, kp); break;
    case 1: tile<RB, 1>(a, r0, i, vecs, kp); break;
    default: break;
  }
}

}  // namespace

void rows_dot_bf16_dpbf16(const RowsDotArgs& a) {
  if (a.num_vecs <= 0 || a.row_end <= a.row_begin) return;
  const int64_t kp = (a.k + 31) / 32 * 32;
  const uint16_t* vecs = bf16_vectors(a, kp);
  int64_t r = a.row_begin;
  if (a.num_vecs <= 2) {  // decode: one row at a time
    for (; r < a.row_end; ++r) {
      if (a.num_vecs == 1) {
        row_stream<1>(a, r, vecs, kp);
      } else {
        row_stream<2>(a, r, vecs, kp);
      }
    }
    return;
  }
  for (; r + 4 <= a.row_end; r += 4) row_block<4>(a, r, vecs, kp);
  for (; r < a.row_end; ++r) row_block<1>(a, r, vecs, kp);
}

}  // namespace freetoken
