// decode_impl.h with AVX2 + FMA: a 16-lane vector is two ymm registers (lanes 0-7, 8-15).
#include <immintrin.h>

#include "decode_impl.h"

namespace freetoken {

namespace {

inline __m256 widen8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

struct V16 {
  __m256 lo, hi;

  static V16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V16 broadcast(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static V16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static V16 load_bf16(const uint16_t* p) { return {widen8(p), widen8(p + 8)}; }
  static V16 fma(const V16& a, const V16& b, const V16& acc) {
    return {_mm256_fmadd_ps(a.lo, b.lo, acc.lo), _mm256_fmadd_ps(a.hi, b.hi, acc.hi)};
  }
  static void store(float* p, const V16& x) {
    _mm256_storeu_ps(p, x.lo);
    _mm256_storeu_ps(p + 8, x.hi);
  }
  static float fold(const V16& x) {
    const __m256 s8 = _mm256_add_ps(x.lo, x.hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
  }
  static void fold16(const V16* rows, float* out) {
    for (int r = 0; r < 16; ++r) out[r] = fold(rows[r]);
  }
};

}  // namespace

void attend_chunk_avx2(const AttendArgs& a) { attend_chunk_impl<V16>(a); }

void delta_rule_step_avx2(const DeltaRuleArgs& a) { delta_rule_step_impl<V16>(a); }

}  // namespace freetoken
