// AVX-512 variant of rows_dot for fp8 weights (float8 e4m3fn, fp32 block scales): the AVX2 code
// (rows_fp8_avx2.cpp) on 32 weights per step, so the numerical contract is the same.
//
// Decode of 32 weights (32 bytes), 8 vector ops: vpmovzxbw widens the bytes b to words, and
// h = (b + (b & 0x80)) << 7 is the fp16 bit pattern of e4m3(b) * 2^-8 (see rows_fp8_avx2.cpp);
// vpcmpeqw into a mask register and one masked move turn the NaN codes ((b & 0x7F) == 0x7F)
// into an fp16 NaN, and two vcvtph2ps (exact, subnormals included, MXCSR.DAZ ignored) give two
// 16-lane fp32 halves in column order (VecLayout::kNatural). The 2^8 is folded into the block
// scale. A block's last columns that do not fill 32 are read with masked loads (code 0 and
// vector 0 beyond them), never past a row. Schedules as in the AVX2 code:
//  - decode (at most kFusedMaxVecs vectors): one partial sum per (row, vector, column block), two
//    for a single vector (the halves of a step, which hides the FMA latency), multiplied by the
//    block's scale into the row's accumulator; 4 rows per pass; one prefetch per row and 64
//    columns of the next row block.
//  - more vectors: 4 rows at a time dequantised into a 4 x k fp32 scratch, w = e4m3 * scale
//    rounded to fp32, and run through the dense AVX-512 fp32 tile (rows_dot_f32_avx512).
// Compiled with -mavx512f -mavx512bw -mavx512vl (and the AVX2 flags, see setup_ext.py); called
// only when the CPU reports them (Isa::kAvx512 and up).
// NOTE: no shared inline/template symbols here (see rows_dot_avx2.cpp).
// NOTE: GCC 12 warns (-Wuninitialized) inside its own avx512fintrin.h on _mm256_undefined_*().
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
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

inline __mmask32 first_n(int64_t n) {
  return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << n) - 1);
}

// The 32 e4m3 bytes at p selected by m (others read as code 0, +0.0) -> w[0] columns 0..15,
// w[1] columns 16..31, each value times 2^-8 (exact).
inline void decode32(const uint8_t* p, __mmask32 m, __m512 w[2]) {
  const __m512i b = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, p));
  const __m512i s = _mm512_and_si512(b, _mm512_set1_epi16(0x80));
  __m512i h = _mm512_slli_epi16(_mm512_add_epi16(b, s), 7);
  const __mmask32 nan =
      _mm512_cmpeq_epi16_mask(_mm512_xor_si512(b, s), _mm512_set1_epi16(0x7F));
  h = _mm512_mask_mov_epi16(h, nan, _mm512_set1_epi16(-1));
  w[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  w[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

// The same pointer, opaque to the optimiser (so loads through it are not merged across rows).
inline const float* launder(const float* p) {
  __asm__("" : "+r"(p));
  return p;
}

// RB rows x TB vectors straight from the codes, rows [r0, r0 + RB); NP partial sums per
// (row, vector).
template <int RB, int TB>
inline void fused_tile(const Fp8Args& q, const RowsDotArgs& a, int64_t r0) {
  constexpr int NP = TB == 1 ? 2 : 1;
  __m512 acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
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
    __m512 part[RB][TB][NP];
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t)
        for (int n = 0; n < NP; ++n) part[r][t][n] = _mm512_setzero_ps();
    for (int64_t c = c0; c < c1; c += 32) {
      const __mmask32 m = first_n(c1 - c);
      const __mmask16 m0 = static_cast<__mmask16>(m), m1 = static_cast<__mmask16>(m >> 16);
      if ((c & 63) < 32) {  // once per 64 columns
        for (int r = 0; r < RB; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + c), _MM_HINT_T0);
        }
      }
      for (int r = 0; r < RB; ++r) {
        __m512 w[2];
        decode32(rows[r] + c, m, w);
        for (int t = 0; t < TB; ++t) {
          const float* v = launder(vecs[t] + c);
          part[r][t][0] = _mm512_fmadd_ps(w[0], _mm512_maskz_loadu_ps(m0, v), part[r][t][0]);
          part[r][t][NP - 1] =
              _mm512_fmadd_ps(w[1], _mm512_maskz_loadu_ps(m1, v + 16), part[r][t][NP - 1]);
        }
      }
    }
    for (int r = 0; r < RB; ++r) {
      const __m512 s = _mm512_set1_ps(srow[r][b] * 256.0f);
      for (int t = 0; t < TB; ++t) {
        const __m512 p = NP == 2 ? _mm512_add_ps(part[r][t][0], part[r][t][NP - 1])
                                 : part[r][t][0];
        acc[r][t] = _mm512_fmadd_ps(p, s, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t)
      a.out[t * a.out_stride + (r0 + r - a.row_begin)] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int TB>
inline void fused_rows(const Fp8Args& q, const RowsDotArgs& a) {
  int64_t r = a.row_begin;
  for (; r + 4 <= a.row_end; r += 4) fused_tile<4, TB>(q, a, r);
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
    const __m512 s = _mm512_set1_ps(srow[b] * 256.0f);
    for (int64_t c = c0; c < c1; c += 32) {
      const __mmask32 m = first_n(c1 - c);
      __m512 w[2];
      decode32(row + c, m, w);
      _mm512_mask_storeu_ps(dst + c, static_cast<__mmask16>(m), _mm512_mul_ps(w[0], s));
      _mm512_mask_storeu_ps(dst + c + 16, static_cast<__mmask16>(m >> 16),
                            _mm512_mul_ps(w[1], s));
    }
  }
}

void scratch_rows(const Fp8Args& q, const RowsDotArgs& a) {
  scratch_rows(
      a,
      [&](int64_t r0, int64_t r1, float* scratch) {
        for (int64_t r = r0; r < r1; ++r) dequant_row(q, r, scratch + (r - r0) * a.k);
      },
      [&](const RowsDotArgs& one) { fused(q, one); }, rows_dot_f32_avx512,
      [](int64_t, int64_t) {});
}

}  // namespace

void rows_dot_fp8_avx512(const RowsDotArgs& a) {
  if (a.num_vecs <= 0 || a.row_end <= a.row_begin) return;
  const Fp8Args q = fp8_args(a);
  if (a.num_vecs > kFusedMaxVecs) {
    scratch_rows(q, a);
  } else {
    fused(q, a);
  }
}

}  // namespace freetoken
