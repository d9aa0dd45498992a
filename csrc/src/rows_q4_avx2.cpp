// AVX2 + FMA + F16C variant of rows_dot for the 4-bit formats (mxfp4, q4g).
//
// A 32-column block is 16 bytes of codes: the low and high nibbles are split with a mask and a
// shift, mapped through the group's 16-entry int8 table with one vpshufb each (freetoken/nibble.h),
// re-interleaved into column order, and widened to 4 x 8 fp32 integers. Two schedules:
//  - decode (at most kFusedMaxVecs vectors): the integers are multiplied straight into per-group
//    fp32 partial sums, scaled once per group: acc += scale * sum(lut[c] * v). Nothing is written.
//  - more vectors: 4 rows at a time are dequantised (lut[c] * scale, exact) into a 4 x k fp32
//    scratch and handed to the dense fp32 AVX2 tile, so the decode cost is shared by all vectors.
// Compiled with -mavx2 -mfma -mf16c only; called only when the CPU reports all three.
// NOTE: no shared inline/template symbols here (see rows_dot_avx2.cpp): helpers are file-local.
#include <immintrin.h>

#include <cstdlib>

#include "freetoken/isa.h"
#include "freetoken/nibble.h"

namespace freetoken {

namespace {

constexpr int64_t kFusedMaxVecs = 2;

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Table (as 16 int8 lanes) and scale of group g of row r (groups = a.k / a.group, hoisted by the
// callers: a 64-bit division per group would cost as much as decoding it).
inline float group_lut(const RowsDotArgs& a, int64_t groups, int64_t r, int64_t g, __m128i* lut) {
  const int64_t idx = r * groups + g;
  if (a.format == WeightFormat::kMxfp4) {
    *lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Lut));
    return e8m0_half_scale(static_cast<const uint8_t*>(a.scales)[idx]);
  }
  const __m128i iota = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  *lut = _mm_sub_epi8(iota, _mm_set1_epi8(static_cast<char>(a.zeros ? a.zeros[idx] : 8)));
  return _cvtsh_ss(static_cast<const uint16_t*>(a.scales)[idx]);
}

// 32 codes (16 bytes, low nibble = even column) -> 4 x 8 fp32 table values in column order.
inline void decode32(const uint8_t* p, __m128i lut, __m256 w[4]) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, mask));
  const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), mask));
  const __m128i v0 = _mm_unpacklo_epi8(lo, hi);  // columns 0..15
  const __m128i v1 = _mm_unpackhi_epi8(lo, hi);  // columns 16..31
  w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0));
  w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v0, v0)));
  w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1));
  w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v1, v1)));
}

// RB rows x TB vectors straight from the codes.
template <int RB, int TB>
inline void fused_tile(const RowsDotArgs& a, int64_t r0, int64_t i0) {
  const auto* codes = static_cast<const uint8_t*>(a.w);
  const int64_t groups = a.k / a.group, blocks = a.group / 32, row_bytes = a.k / 2;
  const int64_t half_group = a.group / 2;
  __m256 acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm256_setzero_ps();
  const float* vecs[TB];
  for (int t = 0; t < TB; ++t) vecs[t] = a.vecs[i0 + t];
  for (int64_t g = 0; g < groups; ++g) {
    for (int r = 0; r < RB; ++r) {
      __m128i lut;
      const __m256 scale = _mm256_set1_ps(group_lut(a, groups, r0 + r, g, &lut));
      const uint8_t* p = codes + (r0 + r) * row_bytes + g * half_group;
      __m256 part[TB];
      for (int t = 0; t < TB; ++t) part[t] = _mm256_setzero_ps();
      for (int64_t b = 0; b < blocks; ++b) {
        __m256 w[4];
        decode32(p + b * 16, lut, w);
        const int64_t col = g * a.group + b * 32;
        for (int t = 0; t < TB; ++t) {
          for (int q = 0; q < 4; ++q) {
            part[t] = _mm256_fmadd_ps(w[q], _mm256_loadu_ps(vecs[t] + col + 8 * q), part[t]);
          }
        }
      }
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm256_fmadd_ps(part[t], scale, acc[r][t]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t)
      a.out[(i0 + t) * a.out_stride + (r0 + r - a.row_begin)] = hsum8(acc[r][t]);
}

template <int TB>
inline void fused_rows(const RowsDotArgs& a, int64_t i0) {
  int64_t r = a.row_begin;
  for (; r + 4 <= a.row_end; r += 4) fused_tile<4, TB>(a, r, i0);
  for (; r < a.row_end; ++r) fused_tile<1, TB>(a, r, i0);
}

// Rows [r0, r1) dequantised (exactly) into dst [r1 - r0, k] fp32.
inline void dequant_rows(const RowsDotArgs& a, int64_t r0, int64_t r1, float* dst) {
  const auto* codes = static_cast<const uint8_t*>(a.w);
  const int64_t groups = a.k / a.group, blocks = a.group / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = codes + r * (a.k / 2);
    float* out = dst + (r - r0) * a.k;
    for (int64_t g = 0; g < groups; ++g) {
      __m128i lut;
      const __m256 scale = _mm256_set1_ps(group_lut(a, groups, r, g, &lut));
      for (int64_t b = 0; b < blocks; ++b) {
        __m256 w[4];
        decode32(row + g * (a.group / 2) + b * 16, lut, w);
        float* o = out + g * a.group + b * 32;
        for (int q = 0; q < 4; ++q) _mm256_storeu_ps(o + 8 * q, _mm256_mul_ps(w[q], scale));
      }
    }
  }
}

void scratch_rows(const RowsDotArgs& a) {
  constexpr int64_t kRows = 4;
  float* scratch = static_cast<float*>(std::malloc(sizeof(float) * kRows * a.k));
  if (scratch == nullptr) {  // out of memory: the slower schedule needs none
    for (int64_t i = 0; i < a.num_vecs; ++i) fused_rows<1>(a, i);
    return;
  }
  for (int64_t r0 = a.row_begin; r0 < a.row_end; r0 += kRows) {
    const int64_t r1 = r0 + kRows < a.row_end ? r0 + kRows : a.row_end;
    dequant_rows(a, r0, r1, scratch);
    RowsDotArgs d;
    d.format = WeightFormat::kFp32;
    d.w = scratch;
    d.k = a.k;
    d.row_begin = 0;
    d.row_end = r1 - r0;
    d.vecs = a.vecs;
    d.num_vecs = a.num_vecs;
    d.out = a.out + (r0 - a.row_begin);
    d.out_stride = a.out_stride;
    rows_dot_f32_avx2(d);
  }
  std::free(scratch);
}

}  // namespace

void rows_dot_q4_avx2(const RowsDotArgs& a) {
  switch (a.num_vecs) {
    case 0: return;
    case 1: fused_rows<1>(a, 0); return;
    case kFusedMaxVecs: fused_rows<kFusedMaxVecs>(a, 0); return;
    default: scratch_rows(a); return;
  }
}

}  // namespace freetoken
