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
  // out[r] = fold(rows[r]) for 16 rows, as a transposing tree: each level adds the same lane
  // pairs as fold (l, l + 8 / 4 / 2 / 1) for every row at once, then one permute restores order.
  static void fold16(const V16* rows, float* out) {
    __m512 c[8], d[4], e[2];
    for (int k = 0; k < 8; ++k) {  // lanes 0-7: row 2k, 8-15: row 2k + 1
      const __m512 a = rows[2 * k].v, b = rows[2 * k + 1].v;
      c[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
    for (int k = 0; k < 4; ++k) {  // 128-bit unit u: row 4k + u
      d[k] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * k], c[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(c[2 * k], c[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    }
    for (int k = 0; k < 2; ++k) {  // unit u: lanes 0-1 row 8k + u, lanes 2-3 row 8k + 4 + u
      e[k] = _mm512_add_ps(_mm512_shuffle_ps(d[2 * k], d[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(d[2 * k], d[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // lane 4u + v holds row 4v + u
    const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, f));
  }
};

}  // namespace

void attend_chunk_avx512(const AttendArgs& a) { attend_chunk_impl<V16>(a); }

void delta_rule_step_avx512(const DeltaRuleArgs& a) { delta_rule_step_impl<V16>(a); }

}  // namespace freetoken
