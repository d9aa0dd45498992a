// AVX2 + FMA variants of rows_dot for dense weights, fp32 FMA with the fp32 vectors. Compiled
// with -mavx2 -mfma -mf16c only (see setup_ext.py); called only when the CPU reports all three.
//  - bf16: 16 weights (one 32-byte load) per step, widened without a shuffle: a bf16 is the top
//    half of an fp32, so `raw << 16` gives the 8 even columns and `raw & 0xFFFF0000` the 8 odd
//    ones. The vectors come in VecLayout::kEvenOdd16, whose blocks hold exactly that order.
//  - fp32: 8 weights per load, vectors in column order.
// Each tile holds RB rows x TB vectors of accumulators over the whole reduction (two per pair
// when the tile is small, so that the FMA latency is hidden at decode, TB = 1), reuses every
// vector load for RB rows, and prefetches the next row block while it reads this one. A single
// vector (decode) has no load to share, so it runs one row at a time with no software prefetch:
// one sequential stream that the hardware prefetcher follows, measured 1.4x the bandwidth of
// four interleaved rows on a 2-core Zen 4 (the same accumulators, so the same sums).
// NOTE: nothing here may instantiate a shared inline/template symbol (std::vector, std::exp...):
// the linker could pick this AVX2 copy for callers on CPUs without AVX2. Helpers are file-local.
#include <immintrin.h>

#include "freetoken/isa.h"

namespace freetoken {

namespace {

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float to_f32(uint16_t bits) {
  __m128i u = _mm_cvtsi32_si128(static_cast<int>(static_cast<uint32_t>(bits) << 16));
  return _mm_cvtss_f32(_mm_castsi128_ps(u));
}
inline float to_f32(float v) { return v; }

// Weight type traits: columns per step, and the two 8-lane fp32 halves of one step.
//   bf16: 16 columns; half 0 = even columns, half 1 = odd columns (kEvenOdd16).
//   fp32: 16 columns as two plain 8-column loads (kNatural).
inline void load_step(const uint16_t* p, __m256 w[2]) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  w[0] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
  w[1] = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(0xFFFF0000u)));
}
inline void load_step(const float* p, __m256 w[2]) {
  w[0] = _mm256_loadu_ps(p);
  w[1] = _mm256_loadu_ps(p + 8);
}

// RB rows x TB vectors; NA accumulators per (row, vector): 2 splits the two halves of a step.
template <typename T, int RB, int TB>
inline void tile(const RowsDotArgs& a, int64_t r0, int64_t i0) {
  constexpr int NA = RB * TB <= 4 ? 2 : 1;
  constexpr int kLine = 64 / sizeof(T);  // columns per cache line
  __m256 acc[RB][TB][NA];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t)
      for (int n = 0; n < NA; ++n) acc[r][t][n] = _mm256_setzero_ps();
  const T* rows[RB];
  for (int r = 0; r < RB; ++r) rows[r] = static_cast<const T*>(a.w) + (r0 + r) * a.k;
  const int64_t ahead = RB * a.k;  // same column, next row block
  const float* vecs[TB];
  for (int t = 0; t < TB; ++t) vecs[t] = a.vecs[i0 + t];
  const int64_t k16 = a.k & ~int64_t{15};
  for (int64_t k = 0; k < k16; k += 16) {
    if (RB > 1 && k % kLine == 0) {
      for (int r = 0; r < RB; ++r) _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + k),
                                                _MM_HINT_T0);
    }
    __m256 v[TB][2];
    for (int t = 0; t < TB; ++t) {
      v[t][0] = _mm256_loadu_ps(vecs[t] + k);
      v[t][1] = _mm256_loadu_ps(vecs[t] + k + 8);
    }
    for (int r = 0; r < RB; ++r) {
      __m256 w[2];
      load_step(rows[r] + k, w);
      for (int t = 0; t < TB; ++t) {
        acc[r][t][0] = _mm256_fmadd_ps(w[0], v[t][0], acc[r][t][0]);
        acc[r][t][NA - 1] = _mm256_fmadd_ps(w[1], v[t][1], acc[r][t][NA - 1]);
      }
    }
  }
  for (int r = 0; r < RB; ++r) {
    for (int t = 0; t < TB; ++t) {
      __m256 sum = acc[r][t][0];
      if (NA == 2) sum = _mm256_add_ps(sum, acc[r][t][NA - 1]);
      float s = hsum8(sum);
      for (int64_t k = k16; k < a.k; ++k) s += to_f32(rows[r][k]) * vecs[t][k];  // in order
      a.out[(i0 + t) * a.out_stride + (r0 + r - a.row_begin)] = s;
    }
  }
}

template <typename T, int RB>
inline void row_block(const RowsDotArgs& a, int64_t r0) {
  // Two vectors per tile: 4 x 2 accumulators + 4 vector halves + 2 weight halves fit the 16 ymm.
  int64_t i = 0;
  for (; i + 2 <= a.num_vecs; i += 2) tile<T, RB, 2>(a, r0, i);
  if (i < a.num_vecs) tile<T, RB, 1>(a, r0, i);
}

template <typename T>
inline void rows_dot_dense(const RowsDotArgs& a) {
  int64_t r = a.row_begin;
  if (a.num_vecs == 1) {  // decode: one row at a time (see the file comment)
    for (; r < a.row_end; ++r) row_block<T, 1>(a, r);
    return;
  }
  for (; r + 4 <= a.row_end; r += 4) row_block<T, 4>(a, r);
  for (; r < a.row_end; ++r) row_block<T, 1>(a, r);
}

}  // namespace

void rows_dot_bf16_avx2(const RowsDotArgs& a) { rows_dot_dense<uint16_t>(a); }
void rows_dot_f32_avx2(const RowsDotArgs& a) { rows_dot_dense<float>(a); }

}  // namespace freetoken
