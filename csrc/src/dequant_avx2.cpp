// MXFP4 rows to dense fp32 / bf16 with AVX2 (freetoken/dequant.h), compiled with -mavx2 -mfma
// -mf16c. Per 32-column block: the 16 code bytes split into low / high nibbles and interleaved
// back into column order, vpshufb maps each code to its doubled e2m1 value (an int8), and
// int8 x 2^(s - 128) is the value exactly; a block with scale 255 (inf) takes the scalar row.
#include <immintrin.h>

#include "freetoken/dequant.h"
#include "freetoken/nibble.h"

namespace freetoken {

void dequantize_mxfp4_row_avx2(const uint8_t* codes, const uint8_t* scales, int64_t groups,
                               bool bf16, void* out) {
  const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Lut));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  for (int64_t g = 0; g < groups; ++g) {
    if (scales[g] == 255) {
      dequantize_mxfp4_row_scalar(codes + g * 16, scales + g, 1, bf16,
                                  static_cast<char*>(out) + g * 32 * (bf16 ? 2 : 4));
      continue;
    }
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + g * 16));
    const __m128i lo = _mm_and_si128(raw, low4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    const __m128i v0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));  // columns 0..15
    const __m128i v1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));  // columns 16..31
    const __m256 s = _mm256_set1_ps(e8m0_half_scale(scales[g]));
    const __m256 f[4] = {
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), s),
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))), s),
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), s),
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))), s)};
    if (!bf16) {
      float* o = static_cast<float*>(out) + g * 32;
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(o + 8 * j, f[j]);
      continue;
    }
    uint16_t* o = static_cast<uint16_t*>(out) + g * 32;
    for (int j = 0; j < 4; j += 2) {  // exact values: the top half of each fp32 is its bf16
      const __m256i a = _mm256_srli_epi32(_mm256_castps_si256(f[j]), 16);
      const __m256i b = _mm256_srli_epi32(_mm256_castps_si256(f[j + 1]), 16);
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 8 * j), packed);
    }
  }
}

}  // namespace freetoken
