// decode_impl.h with AVX-512F: a 16-lane vector is one zmm register.
#include <immintrin.h>

// NOTE: GCC 12 warns (-Wuninitialized) inside its own avx512fintrin.h on _mm256_undefined_*().
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "decode_impl.h"

namespace freetoken {

namespace {

struct V16 {
  __m512 v;

  static V16 zero() { return {_mm512_setzero_ps()}; }
  static V16 broadcast(float x) { return {_mm512_set1_ps(x)}; }
  static V16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static V16 load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
  }
  static V16 fma(const V16& a, const V16& b, const V16& acc) {
    return {_mm512_fmadd_ps(a.v, b.v, acc.v)};
  }
  static void store(float* p, const V16& x) { _mm512_storeu_ps(p, x.v); }
  static float fold(const V16& x) {
    const __m256 lo = _mm512_castps512_ps256(x.v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.v), 1));
    const __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
  }
};

}  // namespace

void attend_chunk_avx512(const AttendArgs& a) { attend_chunk_impl<V16>(a); }

void delta_rule_step_avx512(const DeltaRuleArgs& a) { delta_rule_step_impl<V16>(a); }

}  // namespace freetoken
