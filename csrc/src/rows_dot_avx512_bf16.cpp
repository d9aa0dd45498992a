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

// RB rows x TB vectors: RB*TB zmm accumulators over the full reduction (masked tail).
template <int RB, int TB>
inline void tile(const RowsDotArgs& a, int64_t r0, int64_t i0) {
  __m512 acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint16_t* rows[RB];
  for (int r = 0; r < RB; ++r) rows[r] = static_cast<const uint16_t*>(a.w) + (r0 + r) * a.k;
  const int64_t ahead = RB * a.k;  // same column, next row block
  const float* vecs[TB];
  for (int t = 0; t < TB; ++t) vecs[t] = a.vecs[i0 + t];
  const __mmask32 full = 0xFFFFFFFFu;
  for (int64_t k = 0; k < a.k; k += 32) {
    const int64_t left = a.k - k;
    const __mmask32 m = left >= 32 ? full : static_cast<__mmask32>((1u << left) - 1u);
    __m512bh v[TB];
    for (int t = 0; t < TB; ++t) v[t] = load32_f32_as_bf16(vecs[t] + k, m);
    for (int r = 0; r < RB; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + k), _MM_HINT_T0);  // 64 bytes
      __m512bh w = load32_bf16(rows[r] + k, m);
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w, v[t]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t)
      a.out[(i0 + t) * a.out_stride + (r0 + r - a.row_begin)] = hsum16(acc[r][t]);
}

template <int RB>
inline void row_block(const RowsDotArgs& a, int64_t r0) {
  int64_t i = 0;
  for (; i + 4 <= a.num_vecs; i += 4) tile<RB, 4>(a, r0, i);
  switch (a.num_vecs - i) {
    case 3: tile<RB, 3>(a, r0, i); break;
    case 2: tile<RB, 2>(a, r0, i); break;
    case 1: tile<RB, 1>(a, r0, i); break;
    default: break;
  }
}

}  // namespace

void rows_dot_bf16_dpbf16(const RowsDotArgs& a) {
  int64_t r = a.row_begin;
  for (; r + 4 <= a.row_end; r += 4) row_block<4>(a, r);
  for (; r < a.row_end; ++r) row_block<1>(a, r);
}

}  // namespace freetoken
