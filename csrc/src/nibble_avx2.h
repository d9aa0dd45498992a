// AVX2 decode of 4-bit codes through a 16-entry table (freetoken/nibble.h ByteLut), shared by the
// AVX2 kernels of the 4-bit formats (rows_q4_avx2.cpp: mxfp4, q4g; rows_nvfp4_avx2.cpp).
//
// Decode of a 32-column block (16 bytes of codes, low nibble = even column), 13 vector ops:
// one vbroadcasti128 puts the 16 bytes in both 128-bit lanes; vpsrlvd shifts the upper lane by 4
// and one vpand leaves the 32 nibbles as bytes (lower lane: even columns, upper: odd ones); two
// vpshufb map them through the table held as the low and high bytes of each value's bf16 bit
// pattern (every table value is a small integer, exact in bf16); vpunpck{l,h}bw join the bytes
// into 16 bf16 each, and since a bf16 is the top half of an fp32, vpslld 16 / vpand 0xFFFF0000
// on those dwords give 4 x 8 fp32. The values come out in VecLayout::kNibble16 order.
// NOTE: static functions only (internal linkage); include only from files compiled with
// -mavx2 -mfma -mf16c.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace freetoken {

static inline __m256i lut_lanes(const uint8_t* bytes16) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes16)));
}

// The 16 code bytes in `raw` (the same in both lanes) -> f[j] = table values of 8 columns each,
// in kNibble16 order: f[0], f[1] hold columns 0..15, f[2], f[3] columns 16..31 (see isa.h).
static inline void decode32_lanes(__m256i raw, __m256i lut_lo, __m256i lut_hi, __m256 f[4]) {
  const __m256i nib = _mm256_and_si256(
      _mm256_srlv_epi32(raw, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F));
  const __m256i lb = _mm256_shuffle_epi8(lut_lo, nib);
  const __m256i hb = _mm256_shuffle_epi8(lut_hi, nib);
  // Word m of lane 0 / lane 1: bf16 of column 2m / 2m + 1 (w01), 16 + 2m / 17 + 2m (w23).
  const __m256i w01 = _mm256_unpacklo_epi8(lb, hb);
  const __m256i w23 = _mm256_unpackhi_epi8(lb, hb);
  // A bf16 is the top half of an fp32: the low word of each dword shifted up, the high word
  // masked, give 8 fp32 each without a shuffle.
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  f[0] = _mm256_castsi256_ps(_mm256_slli_epi32(w01, 16));    // 0 4 8 12 | 1 5 9 13
  f[1] = _mm256_castsi256_ps(_mm256_and_si256(w01, high));   // 2 6 10 14 | 3 7 11 15
  f[2] = _mm256_castsi256_ps(_mm256_slli_epi32(w23, 16));    // 16 + the same
  f[3] = _mm256_castsi256_ps(_mm256_and_si256(w23, high));
}

// 16 code bytes at p (32 columns).
static inline void decode32(const uint8_t* p, __m256i lut_lo, __m256i lut_hi, __m256 f[4]) {
  decode32_lanes(lut_lanes(p), lut_lo, lut_hi, f);
}

// 8 code bytes at p (16 columns, read no further): f[0], f[1] as decode32's; f[2], f[3] hold
// the table value of code 0.
static inline void decode16(const uint8_t* p, __m256i lut_lo, __m256i lut_hi, __m256 f[4]) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  decode32_lanes(_mm256_broadcastsi128_si256(b), lut_lo, lut_hi, f);
}

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace freetoken
