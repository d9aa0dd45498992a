// AVX2 + FMA + F16C variant of rows_dot for fp8 weights (float8 e4m3fn, fp32 block scales).
//
// Decode of 16 weights (16 bytes), 10 vector ops, no table: vpmovzxbw widens the bytes b to
// words; with s = b & 0x80, h = (b + s) << 7 puts the sign at bit 15 and the 7 exponent and
// mantissa bits at bits 7..13, which is the fp16 bit pattern of e4m3(b) * 2^-8 (fp16's exponent
// field holds e4m3's 4-bit exponent, its bias 15 against e4m3's 7 gives the 2^-8, and e4m3's
// subnormals land on fp16 subnormals). vcvtph2ps converts that exactly, subnormals included (it
// ignores MXCSR.DAZ, checked on Zen 4); the NaN codes (b & 0x7F) == 0x7F are patched to an fp16
// NaN by one vpcmpeqw + vpor. The 2^8 is folded into the block scale (scale * 256, exact for
// any scale below 2^120, far above what a checkpoint holds).
// The values come out in column order (VecLayout::kNatural). Two schedules:
//  - decode (at most kFusedMaxVecs vectors): the values go straight into FMAs with the vectors,
//    one partial sum per (row, vector, column block), which is multiplied by the block's scale
//    into the row's accumulator; 4 rows per pass for one vector, 2 for two; one prefetch per row
//    and 64 columns of the next row block. A block's last columns that do not fill 16 (a ragged
//    last block, or block_cols not a multiple of 16) go through zero-padded copies.
//  - more vectors: 4 rows at a time are dequantised into a 4 x k fp32 scratch, w = e4m3 * scale
//    rounded to fp32 (the reference's own weights), and run through the dense fp32 AVX2 tile
//    (rows_dot_f32_avx2), so the decode cost is shared by all vectors.
// Compiled with -mavx2 -mfma -mf16c only; called only when the CPU reports all three.
// NOTE: no shared inline/template symbols here (see rows_dot_avx2.cpp): helpers are file-local.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

#include "freetoken/fp8.h"
#include "freetoken/isa.h"
#include "rows_scratch.h"

namespace freetoken {

namespace {

constexpr int64_t kFusedMaxVecs = 2;

struct Fp8Args {
  const uint8_t* codes;
  const float* scales;  // [ceil(rows / bm), blocks]
  int64_t k, bm, bn, blocks;
};

Fp8Args fp8_args(const RowsDotArgs& a) {
  return {static_cast<const uint8_t*>(a.w), static_cast<const float*>(a.scales), a.k,
          a.block_rows, a.block_cols, ceil_div(a.k, a.block_cols)};
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 e4m3 bytes at p -> w[0] columns 0..7, w[1] columns 8..15, each value times 2^-8 (exact).
inline void decode16(const uint8_t* p, __m256 w[2]) {
  const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i s = _mm256_and_si256(b, _mm256_set1_epi16(0x80));
  __m256i h = _mm256_slli_epi16(_mm256_add_epi16(b, s), 7);
  h = _mm256_or_si256(h, _mm256_cmpeq_epi16(_mm256_xor_si256(b, s), _mm256_set1_epi16(0x7F)));
  w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  w[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// The same pointer, opaque to the optimiser (so loads through it are not merged across rows).
inline const float* launder(const float* p) {
  __asm__("" : "+r"(p));
  return p;
}

// part[r][t] += the 16 weights of rows[r] at column c times vecs[t][c:c+16].
template <int RB, int TB>
inline void step16(const uint8_t* const* rows, const float* const* vecs, int64_t c,
                   __m256 part[RB][TB]) {
  for (int r = 0; r < RB; ++r) {
    __m256 w[2];
    decode16(rows[r] + c, w);
    for (int t = 0; t < TB; ++t) {
      const float* v = launder(vecs[t] + c);
      part[r][t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(v), part[r][t]);
      part[r][t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(v + 8), part[r][t]);
    }
  }
}

// RB rows x TB vectors straight from the codes, rows [r0, r0 + RB).
template <int RB, int TB>
inline void fused_tile(const Fp8Args& q, const RowsDotArgs& a, int64_t r0) {
  __m256 acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm256_setzero_ps();
  const uint8_t* rows[RB];
  const float* srow[RB];
  for (int r = 0; r < RB; ++r) {
    rows[r] = q.codes + (r0 + r) * q.k;
    srow[r] = q.scales + ((r0 + r) / q.bm) * q.blocks;
  }
  const float* vecs[TB];
  for (int t = 0; t < TB; ++t) vecs[t] = a.vecs[t];
  const int64_t ahead = RB * q.k;  // same column, next row block
  for (int64_t b = 0; b < q.blocks; ++b) {
    const int64_t c0 = b * q.bn, c1 = c0 + q.bn < q.k ? c0 + q.bn : q.k;
    __m256 part[RB][TB];
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t) part[r][t] = _mm256_setzero_ps();
    int64_t c = c0;
    for (; c + 16 <= c1; c += 16) {
      if ((c & 63) < 16) {  // once per 64 columns
        for (int r = 0; r < RB; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + c), _MM_HINT_T0);
        }
      }
      step16<RB, TB>(rows, vecs, c, part);
    }
    if (c < c1) {  // the block's last n < 16 columns, zero-padded (code 0 is +0.0)
      const int64_t n = c1 - c;
      alignas(32) uint8_t cb[RB][16] = {};
      alignas(32) float vb[TB][16] = {};
      const uint8_t* crow[RB];
      const float* cvec[TB];
      for (int r = 0; r < RB; ++r) {
        __builtin_memcpy(cb[r], rows[r] + c, n);
        crow[r] = cb[r];
      }
      for (int t = 0; t < TB; ++t) {
        __builtin_memcpy(vb[t], vecs[t] + c, n * sizeof(float));
        cvec[t] = vb[t];
      }
      step16<RB, TB>(crow, cvec, 0, part);
    }
    for (int r = 0; r < RB; ++r) {
      const __m256 s = _mm256_set1_ps(srow[r][b] * 256.0f);
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm256_fmadd_ps(part[r][t], s, acc[r][t]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t)
      a.out[t * a.out_stride + (r0 + r - a.row_begin)] = hsum8(acc[r][t]);
}

template <int TB>
inline void fused_rows(const Fp8Args& q, const RowsDotArgs& a) {
  // Rows per pass: 4 accumulators + 4 partial sums + 2 vector halves + 2 decoded halves and the
  // constants fit the 16 ymm for one vector; two vectors take 2 rows.
  constexpr int RB = TB == 1 ? 4 : 2;
  int64_t r = a.row_begin;
  for (; r + RB <= a.row_end; r += RB) fused_tile<RB, TB>(q, a, r);
  for (; r < a.row_end; ++r) fused_tile<1, TB>(q, a, r);
}

inline void fused(const Fp8Args& q, const RowsDotArgs& a) {
  if (a.num_vecs == 1) {
    fused_rows<1>(q, a);
  } else {
    fused_rows<2>(q, a);
  }
}

// Row r dequantised into dst [k] fp32: e4m3 * scale rounded once, column order.
inline void dequant_row(const Fp8Args& q, int64_t r, float* dst) {
  const uint8_t* row = q.codes + r * q.k;
  const float* srow = q.scales + (r / q.bm) * q.blocks;
  for (int64_t b = 0; b < q.blocks; ++b) {
    const int64_t c0 = b * q.bn, c1 = c0 + q.bn < q.k ? c0 + q.bn : q.k;
    const __m256 s = _mm256_set1_ps(srow[b] * 256.0f);
    int64_t c = c0;
    for (; c + 16 <= c1; c += 16) {
      __m256 w[2];
      decode16(row + c, w);
      _mm256_storeu_ps(dst + c, _mm256_mul_ps(w[0], s));
      _mm256_storeu_ps(dst + c + 8, _mm256_mul_ps(w[1], s));
    }
    for (; c < c1; ++c) dst[c] = kE4m3.v[row[c]] * srow[b];  // the same product, rounded once
  }
}

void scratch_rows(const Fp8Args& q, const RowsDotArgs& a) {
  scratch_rows(
      a,
      [&](int64_t r0, int64_t r1, float* scratch) {
        for (int64_t r = r0; r < r1; ++r) dequant_row(q, r, scratch + (r - r0) * a.k);
      },
      [&](const RowsDotArgs& one) { fused(q, one); }, rows_dot_f32_avx2,
      [](int64_t, int64_t) {});
}

}  // namespace

void rows_dot_fp8_avx2(const RowsDotArgs& a) {
  if (a.num_vecs <= 0 || a.row_end <= a.row_begin) return;
  const Fp8Args q = fp8_args(a);
  if (a.num_vecs > kFusedMaxVecs) {
    scratch_rows(q, a);
  } else {
    fused(q, a);
  }
}

}  // namespace freetoken
