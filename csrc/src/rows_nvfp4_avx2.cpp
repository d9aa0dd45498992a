// AVX2 + FMA + F16C variant of rows_dot for NVFP4 weights (e2m1 codes, e4m3 scales per 16
// columns, one fp32 scale per row).
//
// The codes are decoded 32 columns (16 bytes, two groups) at a time by the 4-bit AVX2 decode of
// nibble_avx2.h through the mxfp4 table 2 * e2m1 (ByteLut kMxfp4Bytes: small integers, exact in
// bf16), so the values come out in VecLayout::kNibble16 order and the vectors are packed in that
// order once (moe.cpp); each 16-column half of a block is one NVFP4 group. A group's scale is
// e4m3(s) / 2 from the exact table of freetoken/fp8.h (with the doubled codes, value * scale is
// e2m1 * e4m3 exactly), and the row's fp32 scale multiplies the row's sum once. Two schedules:
//  - decode (at most kFusedMaxVecs vectors): per group, two products summed per (row, vector)
//    and scaled by the group's scale into the row's accumulator; 4 rows per pass for one vector,
//    2 for two; scales are decoded kScaleChunk groups at a time per row; one prefetch per row
//    and 64 code bytes of the next row block. A last odd group (k % 32 == 16) is read with an
//    8-byte load.
//  - more vectors: 4 rows at a time are dequantised (value * scale, exact) into a 4 x k fp32
//    scratch in the same order and run through the dense fp32 AVX2 tile (rows_dot_f32_avx2);
//    its outputs are then multiplied by the row scales, the same math as the fused schedule.
// Compiled with -mavx2 -mfma -mf16c only; called only when the CPU reports all three.
// NOTE: no shared inline/template symbols here (see rows_dot_avx2.cpp): helpers are file-local
// (those of nibble_avx2.h are static).
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

#include "freetoken/fp8.h"
#include "freetoken/isa.h"
#include "freetoken/nibble.h"
#include "nibble_avx2.h"
#include "rows_scratch.h"

namespace freetoken {

namespace {

constexpr int64_t kFusedMaxVecs = 2;
constexpr int64_t kScaleChunk = 64;  // groups whose scales a tile decodes at once (per row)

struct Nvfp4Args {
  const uint8_t* codes;
  const uint8_t* scales;     // [rows, groups] e4m3 bytes
  const float* row_scales;   // [rows]
  int64_t k, groups, row_bytes;
};

Nvfp4Args nvfp4_args(const RowsDotArgs& a) {
  return {static_cast<const uint8_t*>(a.w), static_cast<const uint8_t*>(a.scales), a.row_scales,
          a.k, a.k / 16, a.k / 2};
}

// The same pointer, opaque to the optimiser (so loads through it are not merged across rows).
inline const float* launder(const float* p) {
  __asm__("" : "+r"(p));
  return p;
}

// RB rows x TB vectors straight from the codes, rows [r0, r0 + RB).
template <int RB, int TB>
inline void fused_tile(const Nvfp4Args& q, const RowsDotArgs& a, int64_t r0) {
  __m256 acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm256_setzero_ps();
  const uint8_t* rows[RB];
  for (int r = 0; r < RB; ++r) rows[r] = q.codes + (r0 + r) * q.row_bytes;
  const float* vecs[TB];
  for (int t = 0; t < TB; ++t) vecs[t] = a.vecs[t];
  const int64_t ahead = RB * q.row_bytes;  // same column, next row block
  const __m256i lut_lo = lut_lanes(kMxfp4Bytes.lo), lut_hi = lut_lanes(kMxfp4Bytes.hi);
  alignas(32) float sc[RB][kScaleChunk];
  for (int64_t g0 = 0; g0 < q.groups; g0 += kScaleChunk) {
    const int64_t ng = q.groups - g0 < kScaleChunk ? q.groups - g0 : kScaleChunk;
    for (int r = 0; r < RB; ++r) {
      const uint8_t* s = q.scales + (r0 + r) * q.groups + g0;
      for (int64_t j = 0; j < ng; ++j) sc[r][j] = kE4m3.v[s[j]] * 0.5f;
    }
    int64_t gi = 0;
    for (; gi + 2 <= ng; gi += 2) {
      const int64_t g = g0 + gi;
      for (int r = 0; r < RB; ++r) {
        const uint8_t* p = rows[r] + g * 8;
        if (g % 8 == 0) _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
        __m256 f[4];
        decode32(p, lut_lo, lut_hi, f);
        const __m256 sa = _mm256_broadcast_ss(&sc[r][gi]);
        const __m256 sb = _mm256_broadcast_ss(&sc[r][gi + 1]);
        for (int t = 0; t < TB; ++t) {
          const float* v = launder(vecs[t] + g * 16);
          const __m256 pa = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(v + 8),
                                            _mm256_mul_ps(f[0], _mm256_loadu_ps(v)));
          const __m256 pb = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(v + 24),
                                            _mm256_mul_ps(f[2], _mm256_loadu_ps(v + 16)));
          acc[r][t] = _mm256_fmadd_ps(pb, sb, _mm256_fmadd_ps(pa, sa, acc[r][t]));
        }
      }
    }
    if (gi < ng) {  // the row's last group, alone (groups odd): 8 code bytes
      const int64_t g = g0 + gi;
      for (int r = 0; r < RB; ++r) {
        __m256 f[4];
        decode16(rows[r] + g * 8, lut_lo, lut_hi, f);
        const __m256 sa = _mm256_broadcast_ss(&sc[r][gi]);
        for (int t = 0; t < TB; ++t) {
          const float* v = vecs[t] + g * 16;
          const __m256 pa = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(v + 8),
                                            _mm256_mul_ps(f[0], _mm256_loadu_ps(v)));
          acc[r][t] = _mm256_fmadd_ps(pa, sa, acc[r][t]);
        }
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t)
      a.out[t * a.out_stride + (r0 + r - a.row_begin)] =
          hsum8(acc[r][t]) * q.row_scales[r0 + r];
}

template <int TB>
inline void fused_rows(const Nvfp4Args& q, const RowsDotArgs& a) {
  constexpr int RB = TB == 1 ? 4 : 2;
  int64_t r = a.row_begin;
  for (; r + RB <= a.row_end; r += RB) fused_tile<RB, TB>(q, a, r);
  for (; r < a.row_end; ++r) fused_tile<1, TB>(q, a, r);
}

inline void fused(const Nvfp4Args& q, const RowsDotArgs& a) {
  if (a.num_vecs == 1) {
    fused_rows<1>(q, a);
  } else {
    fused_rows<2>(q, a);
  }
}

// Row r dequantised without its row scale (e2m1 * e4m3, exact) into dst [k], kNibble16 order.
inline void dequant_row(const Nvfp4Args& q, int64_t r, float* dst) {
  const __m256i lut_lo = lut_lanes(kMxfp4Bytes.lo), lut_hi = lut_lanes(kMxfp4Bytes.hi);
  const uint8_t* row = q.codes + r * q.row_bytes;
  const uint8_t* s = q.scales + r * q.groups;
  int64_t g = 0;
  for (; g + 2 <= q.groups; g += 2) {
    __m256 f[4];
    decode32(row + g * 8, lut_lo, lut_hi, f);
    const __m256 sa = _mm256_set1_ps(kE4m3.v[s[g]] * 0.5f);
    const __m256 sb = _mm256_set1_ps(kE4m3.v[s[g + 1]] * 0.5f);
    float* o = dst + g * 16;
    _mm256_storeu_ps(o, _mm256_mul_ps(f[0], sa));
    _mm256_storeu_ps(o + 8, _mm256_mul_ps(f[1], sa));
    _mm256_storeu_ps(o + 16, _mm256_mul_ps(f[2], sb));
    _mm256_storeu_ps(o + 24, _mm256_mul_ps(f[3], sb));
  }
  if (g < q.groups) {
    __m256 f[4];
    decode16(row + g * 8, lut_lo, lut_hi, f);
    const __m256 sa = _mm256_set1_ps(kE4m3.v[s[g]] * 0.5f);
    _mm256_storeu_ps(dst + g * 16, _mm256_mul_ps(f[0], sa));
    _mm256_storeu_ps(dst + g * 16 + 8, _mm256_mul_ps(f[1], sa));
  }
}

void scratch_rows(const Nvfp4Args& q, const RowsDotArgs& a) {
  scratch_rows(
      a,
      [&](int64_t r0, int64_t r1, float* scratch) {
        for (int64_t r = r0; r < r1; ++r) dequant_row(q, r, scratch + (r - r0) * a.k);
      },
      [&](const RowsDotArgs& one) { fused(q, one); }, rows_dot_f32_avx2,
      [&](int64_t r0, int64_t r1) {  // each row's global scale, once on its sum
        for (int64_t i = 0; i < a.num_vecs; ++i) {
          for (int64_t r = r0; r < r1; ++r) a.out[i * a.out_stride + (r - a.row_begin)] *=
              q.row_scales[r];
        }
      });
}

}  // namespace

void rows_dot_nvfp4_avx2(const RowsDotArgs& a) {
  if (a.num_vecs <= 0 || a.row_end <= a.row_begin) return;
  const Nvfp4Args q = nvfp4_args(a);
  if (a.num_vecs > kFusedMaxVecs) {
    scratch_rows(q, a);
  } else {
    fused(q, a);
  }
}

}  // namespace freetoken
