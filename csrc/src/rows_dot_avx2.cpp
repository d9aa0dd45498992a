// AVX2 + FMA variants of rows_dot for dense weights: bf16 weights widened to fp32 (exact) or fp32
// weights, fp32 FMA with the fp32 vectors. Compiled with -mavx2 -mfma -mf16c only (see
// setup_ext.py); called only when the CPU reports all three.
// NOTE: nothing here may instantiate a shared inline/template symbol (std::vector, std::exp...):
// the linker could pick this AVX2 copy for callers on CPUs without AVX2. Helpers are file-local.
#include <immintrin.h>

#include "freetoken/isa.h"

namespace freetoken {

namespace {

inline __m256 load8_bf16(const uint16_t* p) {
  __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float bf16_to_f32(uint16_t bits) {
  __m128i u = _mm_cvtsi32_si128(static_cast<int>(static_cast<uint32_t>(bits) << 16));
  return _mm_cvtss_f32(_mm_castsi128_ps(u));
}

inline __m256 load8(const uint16_t* p) { return load8_bf16(p); }
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline float to_f32(uint16_t bits) { return bf16_to_f32(bits); }
inline float to_f32(float v) { return v; }

// RB rows x TB vectors: RB*TB ymm accumulators over the full reduction.
template <typename T, int RB, int TB>
inline void tile(const RowsDotArgs& a, int64_t r0, int64_t i0) {
  __m256 acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm256_setzero_ps();
  const T* rows[RB];
  for (int r = 0; r < RB; ++r) rows[r] = static_cast<const T*>(a.w) + (r0 + r) * a.k;
  const float* vecs[TB];
  for (int t = 0; t < TB; ++t) vecs[t] = a.vecs[i0 + t];
  const int64_t k8 = a.k & ~int64_t{7};
  for (int64_t k = 0; k < k8; k += 8) {
    __m256 v[TB];
    for (int t = 0; t < TB; ++t) v[t] = _mm256_loadu_ps(vecs[t] + k);
    for (int r = 0; r < RB; ++r) {
      __m256 w = load8(rows[r] + k);
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm256_fmadd_ps(w, v[t], acc[r][t]);
    }
  }
  for (int r = 0; r < RB; ++r) {
    for (int t = 0; t < TB; ++t) {
      float s = hsum8(acc[r][t]);
      for (int64_t k = k8; k < a.k; ++k) s += to_f32(rows[r][k]) * vecs[t][k];
      a.out[(i0 + t) * a.out_stride + (r0 + r - a.row_begin)] = s;
    }
  }
}

template <typename T, int RB>
inline void row_block(const RowsDotArgs& a, int64_t r0) {
  int64_t i = 0;
  for (; i + 3 <= a.num_vecs; i += 3) tile<T, RB, 3>(a, r0, i);
  if (a.num_vecs - i == 2) tile<T, RB, 2>(a, r0, i);
  if (a.num_vecs - i == 1) tile<T, RB, 1>(a, r0, i);
}

template <typename T>
inline void rows_dot_dense(const RowsDotArgs& a) {
  int64_t r = a.row_begin;
  for (; r + 4 <= a.row_end; r += 4) row_block<T, 4>(a, r);
  for (; r < a.row_end; ++r) row_block<T, 1>(a, r);
}

}  // namespace

void rows_dot_bf16_avx2(const RowsDotArgs& a) { rows_dot_dense<uint16_t>(a); }
void rows_dot_f32_avx2(const RowsDotArgs& a) { rows_dot_dense<float>(a); }

}  // namespace freetoken
