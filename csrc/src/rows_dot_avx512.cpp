// AVX-512F variants of rows_dot for dense weights: fp32 FMA with the fp32 vectors, so the
// numerical contract is the AVX2 one (exact products up to fp32 summation order), with twice the
// lanes and the 32 zmm registers. Compiled with -mavx512f -mavx512bw -mavx512vl (and the AVX2
// flags, see setup_ext.py); called only when the CPU reports them (Isa::kAvx512 and up).
//  - bf16: 32 weights (one 64-byte load, one cache line) per step, widened without a shuffle:
//    `raw << 16` gives the 16 even columns and `raw & 0xFFFF0000` the 16 odd ones, so the vectors
//    come in VecLayout::kEvenOdd32. A trailing partial block (< 32 columns, column order) is read
//    16 columns at a time with masked loads (vpmovzxwd + shift), never past a row.
//  - fp32: 32 weights (two 64-byte loads) per step, column order; the tail masked likewise.
// Each tile holds RB rows x TB vectors of accumulators over the whole reduction (two per pair
// when the tile is small, so that the FMA latency is hidden at decode, TB = 1), reuses every
// vector load for RB rows, and prefetches the next row block while it reads this one. One or two
// vectors (decode) run one row at a time with no software prefetch instead: one sequential stream
// that the hardware prefetcher follows, measured 1.4x the bandwidth of four interleaved rows on a
// 2-core Zen 4 (the same accumulators per row, so the same sums).
// NOTE: no shared inline/template symbols here (see rows_dot_avx2.cpp).
// NOTE: GCC 12 warns (-Wuninitialized) inside its own avx512fintrin.h on _mm256_undefined_*().
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "freetoken/isa.h"

namespace freetoken {

namespace {

inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

// One 32-column step: the two 16-lane fp32 halves (bf16: even, odd columns; fp32: two loads).
inline void load_step(const uint16_t* p, __m512 w[2]) {
  const __m512i raw = _mm512_loadu_si512(p);
  w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
  w[1] = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(0xFFFF0000u)));
}
inline void load_step(const float* p, __m512 w[2]) {
  w[0] = _mm512_loadu_ps(p);
  w[1] = _mm512_loadu_ps(p + 16);
}

// Up to 16 columns in column order (masked lanes read as 0).
inline __m512 load_tail(const uint16_t* p, __mmask16 m) {
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load_tail(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

// RB rows x TB vectors; NA accumulators per (row, vector): 2 splits the two halves of a step.
template <typename T, int RB, int TB>
inline void tile(const RowsDotArgs& a, int64_t r0, int64_t i0) {
  constexpr int NA = RB * TB <= 8 ? 2 : 1;
  constexpr int kLine = 64 / sizeof(T);  // columns per cache line
  __m512 acc[RB][TB][NA];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t)
      for (int n = 0; n < NA; ++n) acc[r][t][n] = _mm512_setzero_ps();
  const T* rows[RB];
  for (int r = 0; r < RB; ++r) rows[r] = static_cast<const T*>(a.w) + (r0 + r) * a.k;
  const int64_t ahead = RB * a.k;  // same column, next row block
  const float* vecs[TB];
  for (int t = 0; t < TB; ++t) vecs[t] = a.vecs[i0 + t];
  const int64_t k32 = a.k & ~int64_t{31};
  for (int64_t k = 0; k < k32; k += 32) {
    for (int64_t c = 0; c < 32; c += kLine) {
      for (int r = 0; r < RB && RB > 1; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + k + c), _MM_HINT_T0);
      }
    }
    __m512 v[TB][2];
    for (int t = 0; t < TB; ++t) {
      v[t][0] = _mm512_loadu_ps(vecs[t] + k);
      v[t][1] = _mm512_loadu_ps(vecs[t] + k + 16);
    }
    for (int r = 0; r < RB; ++r) {
      __m512 w[2];
      load_step(rows[r] + k, w);
      for (int t = 0; t < TB; ++t) {
        acc[r][t][0] = _mm512_fmadd_ps(w[0], v[t][0], acc[r][t][0]);
        acc[r][t][NA - 1] = _mm512_fmadd_ps(w[1], v[t][1], acc[r][t][NA - 1]);
      }
    }
  }
  for (int64_t k = k32; k < a.k; k += 16) {  // trailing partial block, column order
    const int64_t left = a.k - k;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
    __m512 v[TB];
    for (int t = 0; t < TB; ++t) v[t] = _mm512_maskz_loadu_ps(m, vecs[t] + k);
    for (int r = 0; r < RB; ++r) {
      const __m512 w = load_tail(rows[r] + k, m);
      for (int t = 0; t < TB; ++t) acc[r][t][0] = _mm512_fmadd_ps(w, v[t], acc[r][t][0]);
    }
  }
  for (int r = 0; r < RB; ++r) {
    for (int t = 0; t < TB; ++t) {
      __m512 sum = acc[r][t][0];
      if (NA == 2) sum = _mm512_add_ps(sum, acc[r][t][NA - 1]);
      a.out[(i0 + t) * a.out_stride + (r0 + r - a.row_begin)] = hsum16(sum);
    }
  }
}

template <typename T, int RB>
inline void row_block(const RowsDotArgs& a, int64_t r0) {
  // Up to 4 vectors per tile: 4 x 4 accumulators + 8 vector halves + 2 weight halves of 32 zmm.
  int64_t i = 0;
  for (; i + 4 <= a.num_vecs; i += 4) tile<T, RB, 4>(a, r0, i);
  switch (a.num_vecs - i) {
    case 3: tile<T, RB, 3>(a, r0, i); break;
    case 2: tile<T, RB, 2>(a, r0, i); break;
    case 1: tile<T, RB, 1>(a, r0, i); break;
    default: break;
  }
}

template <typename T>
inline void rows_dot_dense(const RowsDotArgs& a) {
  int64_t r = a.row_begin;
  if (a.num_vecs <= 2) {  // decode: one row at a time (see the file comment)
    for (; r < a.row_end; ++r) row_block<T, 1>(a, r);
    return;
  }
  for (; r + 4 <= a.row_end; r += 4) row_block<T, 4>(a, r);
  for (; r < a.row_end; ++r) row_block<T, 1>(a, r);
}

}  // namespace

void rows_dot_bf16_avx512(const RowsDotArgs& a) { rows_dot_dense<uint16_t>(a); }
void rows_dot_f32_avx512(const RowsDotArgs& a) { rows_dot_dense<float>(a); }

}  // namespace freetoken
