// AVX2 + FMA + F16C variant of rows_dot for the 4-bit formats (mxfp4, q4g).
//
// Decode of a 32-column block (16 bytes of codes, low nibble = even column): 13 vector ops
//   through the group's table (ByteLut, freetoken/nibble.h), see nibble_avx2.h.
// The values come out in VecLayout::kNibble16 order (0 4 8 12 1 5 9 13 2 6 10 14 3 7 11 15 in
// each 16-column block), so the vectors are packed in that order once (moe.cpp) and no weight
// is ever shuffled back into column order. Two schedules:
//  - decode (at most kFusedMaxVecs vectors): the values go straight into FMAs with the vectors,
//    two partial sums per (row, vector) per group, scaled once per group into the row's
//    accumulator; 4 rows per pass. Scales are decoded kScaleChunk groups at a time per row (F16C
//    for q4g, integer ops for E8M0); with groups of 32 the groups then run in fours, with one
//    prefetch per row and cache line of the next 4 rows (and of their scales).
//  - more vectors: 4 rows at a time are dequantised (value * scale, exact) into a 4 x k fp32
//    scratch in the same order and run through the dense fp32 AVX2 tile (rows_dot_f32_avx2), so
//    the decode cost is shared by all vectors.
// q4g zero points other than 8 select one of 256 constant tables (c - z, exact for any uint8 z).
// Compiled with -mavx2 -mfma -mf16c only; called only when the CPU reports all three.
// NOTE: no shared inline/template symbols here (see rows_dot_avx2.cpp): helpers are file-local
// (those of nibble_avx2.h are static).
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

#include "freetoken/isa.h"
#include "freetoken/nibble.h"
#include "nibble_avx2.h"
#include "rows_scratch.h"

namespace freetoken {

namespace {

constexpr int64_t kFusedMaxVecs = 2;

// Everything about the bank that the loops need, computed once per rows_dot call.
struct Q4Args {
  const uint8_t* codes;
  const uint8_t* e8m0;     // mxfp4 scales, else nullptr
  const uint16_t* fp16;    // q4g scales, else nullptr
  const uint8_t* zeros;    // q4g zero points, or nullptr (fixed table)
  const ByteLut* lut;      // the fixed table (mxfp4, or q4g with z = 8)
  int64_t groups, group, blocks, row_bytes;
};

Q4Args q4_args(const RowsDotArgs& a) {
  const bool mx = a.format == WeightFormat::kMxfp4;
  Q4Args q;
  q.codes = static_cast<const uint8_t*>(a.w);
  q.e8m0 = mx ? static_cast<const uint8_t*>(a.scales) : nullptr;
  q.fp16 = mx ? nullptr : static_cast<const uint16_t*>(a.scales);
  q.zeros = mx ? nullptr : a.zeros;
  q.lut = mx ? &kMxfp4Bytes : &kQ4gBytes.zero_point[8];
  q.group = a.group;
  q.groups = a.k / a.group;
  q.blocks = a.group / 32;
  q.row_bytes = a.k / 2;
  return q;
}

// fp32 scales of groups [g0, g0 + n) of row r, n <= 8, into s[0:n].
inline void group_scales(const Q4Args& q, int64_t r, int64_t g0, int64_t n, float* s) {
  const int64_t idx = r * q.groups + g0;
  if (q.e8m0 != nullptr) {
    if (n == 8) {  // 2^(e - 128): bits (e - 1) << 23 for e >= 2, subnormal 0x00200000 << e below
      const __m256i e = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q.e8m0 + idx)));
      const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
      const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
      const __m256i is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
      _mm256_storeu_ps(s, _mm256_castsi256_ps(_mm256_blendv_epi8(tiny, normal, is_normal)));
    } else {
      for (int64_t i = 0; i < n; ++i) s[i] = e8m0_half_scale(q.e8m0[idx + i]);
    }
  } else if (n == 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q.fp16 + idx));
    _mm256_storeu_ps(s, _mm256_cvtph_ps(h));
  } else {
    for (int64_t i = 0; i < n; ++i) s[i] = _cvtsh_ss(q.fp16[idx + i]);
  }
}

inline void prefetch_line(const uint8_t* p, int64_t ahead) {
  // One prefetch per 64-byte line: only the 16-byte block that starts a line issues one.
  if ((reinterpret_cast<uintptr_t>(p) & 63) < 16) {
    _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
  }
}

// The same pointer, opaque to the optimiser (so loads through it are not merged across rows).
inline const float* launder(const float* p) {
  __asm__("" : "+r"(p));
  return p;
}

// Scales (and zero points) of rows [r, r + n), which sit apart from the codes.
inline void prefetch_scales(const Q4Args& q, int64_t r, int64_t n) {
  const int64_t idx = r * q.groups, count = n * q.groups;
  const char* s = q.e8m0 != nullptr ? reinterpret_cast<const char*>(q.e8m0 + idx)
                                     : reinterpret_cast<const char*>(q.fp16 + idx);
  const int64_t bytes = q.e8m0 != nullptr ? count : 2 * count;
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(s + o, _MM_HINT_T0);
  if (q.zeros != nullptr) {
    for (int64_t o = 0; o < count; o += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(q.zeros + idx + o), _MM_HINT_T0);
    }
  }
}

// Groups whose scales a tile decodes at once (per row), before the loop that uses them.
constexpr int64_t kScaleChunk = 64;

// One group g of one row: acc[t] += scale * sum over the group's columns of value * vecs[t].
// kPrefetch: prefetch the line `ahead` bytes past each 16-byte block that starts a line.
template <int TB, int kBlocks, bool kPrefetch>
inline void group_dot(const uint8_t* row, int64_t g, int64_t blocks, __m256i lut_lo,
                      __m256i lut_hi, const float* const* vecs, const float* scale,
                      int64_t ahead, __m256* acc) {
  const int64_t group = 32 * (kBlocks > 0 ? kBlocks : blocks);
  const uint8_t* p = row + g * (group / 2);
  __m256 part[TB][2] = {};  // (every block assigns before it adds; zero for the compiler)
  for (int64_t b = 0; b < (kBlocks > 0 ? kBlocks : blocks); ++b) {
    if (kPrefetch) prefetch_line(p + 16 * b, ahead);
    __m256 f[4];
    decode32(p + 16 * b, lut_lo, lut_hi, f);
    const int64_t col = g * group + 32 * b;
    for (int t = 0; t < TB; ++t) {
      // Re-read the vector for every row (L1 hits folded into the FMAs) rather than keep 4 of
      // them in registers, which would push the accumulators out to the stack.
      const float* v = launder(vecs[t] + col);
      const __m256 p0 = _mm256_mul_ps(f[0], _mm256_loadu_ps(v));
      const __m256 p1 = _mm256_mul_ps(f[1], _mm256_loadu_ps(v + 8));
      part[t][0] = b == 0 ? p0 : _mm256_add_ps(part[t][0], p0);
      part[t][1] = b == 0 ? p1 : _mm256_add_ps(part[t][1], p1);
      part[t][0] = _mm256_fmadd_ps(f[2], _mm256_loadu_ps(v + 16), part[t][0]);
      part[t][1] = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(v + 24), part[t][1]);
    }
  }
  const __m256 s = _mm256_broadcast_ss(scale);
  for (int t = 0; t < TB; ++t) {
    acc[t] = _mm256_fmadd_ps(_mm256_add_ps(part[t][0], part[t][1]), s, acc[t]);
  }
}

// RB rows x TB vectors straight from the codes; kZeros: per-group tables from q.zeros;
// kBlocks: 32-column blocks per group (1: groups of 32; 0: q.blocks at run time). Scales are
// decoded kScaleChunk groups at a time; with groups of 32 the groups then run in fours (64 code
// bytes per row), with one unconditional prefetch per row and line.
template <bool kZeros, int RB, int TB, int kBlocks>
inline void fused_tile(const Q4Args& q, const RowsDotArgs& a, int64_t r0, int64_t i0) {
  __m256 acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm256_setzero_ps();
  const float* vecs[TB];
  for (int t = 0; t < TB; ++t) vecs[t] = a.vecs[i0 + t];
  const uint8_t* rows[RB];
  for (int r = 0; r < RB; ++r) rows[r] = q.codes + (r0 + r) * q.row_bytes;
  const int64_t ahead = RB * q.row_bytes;  // same column, next row block
  prefetch_scales(q, r0 + RB, RB);
  __m256i lut_lo = lut_lanes(q.lut->lo), lut_hi = lut_lanes(q.lut->hi);
  const auto set_lut = [&](int r, int64_t g) {
    if (kZeros) {
      const ByteLut& t = kQ4gBytes.zero_point[q.zeros[(r0 + r) * q.groups + g]];
      lut_lo = lut_lanes(t.lo);
      lut_hi = lut_lanes(t.hi);
    }
  };
  alignas(32) float sc[RB][kScaleChunk];
  for (int64_t g0 = 0; g0 < q.groups; g0 += kScaleChunk) {
    const int64_t ng = q.groups - g0 < kScaleChunk ? q.groups - g0 : kScaleChunk;
    for (int r = 0; r < RB; ++r) {
      for (int64_t j = 0; j < ng; j += 8) {
        group_scales(q, r0 + r, g0 + j, ng - j < 8 ? ng - j : 8, &sc[r][j]);
      }
    }
    int64_t gi = 0;
    if (kBlocks == 1) {
      for (; gi + 4 <= ng; gi += 4) {
#pragma GCC unroll 4
        for (int r = 0; r < RB; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(rows[r] + (g0 + gi) * 16 + ahead),
                       _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
#pragma GCC unroll 4
          for (int r = 0; r < RB; ++r) {
            set_lut(r, g0 + gi + u);
            group_dot<TB, 1, false>(rows[r], g0 + gi + u, 1, lut_lo, lut_hi, vecs,
                                    &sc[r][gi + u], ahead, acc[r]);
          }
        }
      }
    }
    for (; gi < ng; ++gi) {
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r) {
        set_lut(r, g0 + gi);
        group_dot<TB, kBlocks, true>(rows[r], g0 + gi, q.blocks, lut_lo, lut_hi, vecs,
                                     &sc[r][gi], ahead, acc[r]);
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t)
      a.out[(i0 + t) * a.out_stride + (r0 + r - a.row_begin)] = hsum8(acc[r][t]);
}

// Rows per pass: 4 for one vector (4 accumulators + 2 partial sums + 4 values + tables and
// constants fit the 16 ymm), 2 for two vectors.
template <bool kZeros, int TB, int kBlocks>
inline void fused_rows(const Q4Args& q, const RowsDotArgs& a) {
  constexpr int RB = TB == 1 ? 4 : 2;
  int64_t r = a.row_begin;
  for (; r + RB <= a.row_end; r += RB) fused_tile<kZeros, RB, TB, kBlocks>(q, a, r, 0);
  for (; r < a.row_end; ++r) fused_tile<kZeros, 1, TB, kBlocks>(q, a, r, 0);
}

template <bool kZeros, int kBlocks>
inline void fused_blocks(const Q4Args& q, const RowsDotArgs& a) {
  if (a.num_vecs == 1) {
    fused_rows<kZeros, 1, kBlocks>(q, a);
  } else {
    fused_rows<kZeros, 2, kBlocks>(q, a);
  }
}

template <bool kZeros>
inline void fused(const Q4Args& q, const RowsDotArgs& a) {
  if (q.blocks == 1) {
    fused_blocks<kZeros, 1>(q, a);
  } else {
    fused_blocks<kZeros, 0>(q, a);
  }
}

// Rows [r0, r1) dequantised (exactly) into dst [r1 - r0, k] fp32, kNibble16 order.
inline void dequant_rows(const Q4Args& q, int64_t k, int64_t r0, int64_t r1, float* dst) {
  alignas(32) float sc[8];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = q.codes + r * q.row_bytes;
    float* out = dst + (r - r0) * k;
    for (int64_t g0 = 0; g0 < q.groups; g0 += 8) {
      const int64_t ng = q.groups - g0 < 8 ? q.groups - g0 : 8;
      group_scales(q, r, g0, ng, sc);
      for (int64_t gi = 0; gi < ng; ++gi) {
        const int64_t g = g0 + gi;
        const ByteLut& t = q.zeros ? kQ4gBytes.zero_point[q.zeros[r * q.groups + g]] : *q.lut;
        const __m256i lut_lo = lut_lanes(t.lo), lut_hi = lut_lanes(t.hi);
        const __m256 s = _mm256_broadcast_ss(&sc[gi]);
        for (int64_t b = 0; b < q.blocks; ++b) {
          __m256 f[4];
          decode32(row + g * (q.group / 2) + 16 * b, lut_lo, lut_hi, f);
          float* o = out + g * q.group + 32 * b;
          for (int j = 0; j < 4; ++j) _mm256_storeu_ps(o + 8 * j, _mm256_mul_ps(f[j], s));
        }
      }
    }
  }
}

void scratch_rows(const Q4Args& q, const RowsDotArgs& a) {
  scratch_rows(
      a, [&](int64_t r0, int64_t r1, float* scratch) { dequant_rows(q, a.k, r0, r1, scratch); },
      [&](const RowsDotArgs& one) { q.zeros ? fused<true>(q, one) : fused<false>(q, one); },
      rows_dot_f32_avx2, [](int64_t, int64_t) {});
}

}  // namespace

void rows_dot_q4_avx2(const RowsDotArgs& a) {
  if (a.num_vecs <= 0 || a.row_end <= a.row_begin) return;
  const Q4Args q = q4_args(a);
  if (a.num_vecs > kFusedMaxVecs) {
    scratch_rows(q, a);
  } else if (q.zeros != nullptr) {
    fused<true>(q, a);
  } else {
    fused<false>(q, a);
  }
}

}  // namespace freetoken
