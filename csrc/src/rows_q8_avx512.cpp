// AVX-512 VNNI variant of the q8 rows_dot for the 4-bit formats (mxfp4, q4g): the AVX2 kernel
// (rows_q8_impl.h, method in rows_q8_avx2.cpp) with the integer sums of each full 256-column chunk
// taken by vpdpbusd on zmm registers: bit-identical outputs (the sums are exact integers and every
// floating-point step is the shared code).
//
// A chunk's 128 code bytes are two groups of 4 blocks, one zmm load each; `& 0x0F` and
// `(>> 4) & 0x0F` give the 128-bit lanes [even columns of block 4g + L] and [odd columns], as u
// (mxfp4 through one vpshufb per nibble vector). Each vector's kPair64 bytes are first reordered
// per 128 bytes from [e0 e1 o0 o1 | e2 e3 o2 o3] (16 bytes each: even / odd columns of a block) to
// [e0 e1 e2 e3 | o0 o1 o2 o3] (once per call and vector, not per row), so two vpdpbusd per group
// leave lane L of the accumulator with 4 int32 partial sums of block 4g + L (|.| <= 8 * 24 * 127).
// vpunpck{l,h}dq of the two groups' accumulators, vpaddd, vpshufd + vpaddd sum each lane's 4
// partials, and one vpermd puts the 8 block sums in the kPair64 slot order [b0 b2 b4 b6 | b1 b3 b5
// b7]. Partial chunks (k not a multiple of 256) keep the AVX2 code on the bytes left in place.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (and AVX2 / FMA / F16C); called only
// when the CPU reports AVX512_VNNI (rows_kernel_for).
#include <immintrin.h>

// NOTE: GCC 12 warns (-Wuninitialized) inside its own avx512fintrin.h on _mm256_undefined_*().
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstdint>
#include <vector>

#include "freetoken/isa.h"
#include "freetoken/nibble.h"
#include "freetoken/q8.h"

namespace freetoken {

namespace {

#include "rows_q8_impl.h"

constexpr int64_t kChunkColumns = kQ8ChunkBlocks * kQ8Block;  // 256
constexpr int64_t kGroupBytes = 128;  // 4 blocks of q8 values

// dst[0:k] = src[0:k] with each 128-byte group of the full chunks reordered to [e0 e1 e2 e3 |
// o0 o1 o2 o3]; the bytes of a partial last chunk are copied as they are.
void quad_order(const int8_t* src, int8_t* dst, int64_t k) {
  const int64_t full = k / kChunkColumns * kChunkColumns;
  int64_t c = 0;
  for (; c < full; c += kGroupBytes) {
    const __m512i x0 = _mm512_loadu_si512(src + c), x1 = _mm512_loadu_si512(src + c + 64);
    _mm512_storeu_si512(dst + c, _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm512_storeu_si512(dst + c + 64, _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (; c < k; ++c) dst[c] = src[c];
}

// Full chunks by vpdpbusd over quad-ordered vectors (see the file comment).
struct VnniSums {
  template <bool kMx, int RB, int TB>
  static void sums(const uint8_t* const* rows, const int8_t* const* xs, __m256i lut,
                   __m256i (*out)[TB]) {
    const __m512i lut4 = _mm512_broadcast_i32x4(_mm256_castsi256_si128(lut));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i acc[2][RB][TB];
    for (int g = 0; g < 2; ++g) {
      for (int r = 0; r < RB; ++r) {
        const __m512i raw = _mm512_loadu_si512(rows[r] + 64 * g);
        __m512i lo = _mm512_and_si512(raw, m4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        if (kMx) {
          lo = _mm512_shuffle_epi8(lut4, lo);
          hi = _mm512_shuffle_epi8(lut4, hi);
        }
        for (int t = 0; t < TB; ++t) {
          const int8_t* x = xs[t] + kGroupBytes * g;
          const __m512i even = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo,
                                                   _mm512_loadu_si512(x));
          acc[g][r][t] = _mm512_dpbusd_epi32(even, hi, _mm512_loadu_si512(x + 64));
        }
      }
    }
    // lane L of the reduced vector: [block L, block 4 + L, ...]; slots take elements 4L, 4L + 1
    const __m512i slots = _mm512_setr_epi32(0, 8, 1, 9, 4, 12, 5, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int r = 0; r < RB; ++r) {
      for (int t = 0; t < TB; ++t) {
        const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[0][r][t], acc[1][r][t]),
                                           _mm512_unpackhi_epi32(acc[0][r][t], acc[1][r][t]));
        const __m512i d = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_BADC));
        out[r][t] = _mm512_castsi512_si256(_mm512_permutexvar_epi32(slots, d));
      }
    }
  }
};

}  // namespace

void rows_dot_q8_avx512(const RowsDotArgs& a) {
  if (a.num_vecs <= 0 || a.row_end <= a.row_begin) return;
  thread_local std::vector<int8_t> quads;
  thread_local std::vector<Q8Vec> vecs;
  quads.resize(static_cast<size_t>(a.num_vecs * a.k));
  vecs.resize(static_cast<size_t>(a.num_vecs));
  for (int64_t i = 0; i < a.num_vecs; ++i) {
    int8_t* q = quads.data() + i * a.k;
    quad_order(a.qvecs[i].q, q, a.k);
    vecs[i] = {q, a.qvecs[i].d, a.qvecs[i].sums};
  }
  RowsDotArgs b = a;
  b.qvecs = vecs.data();
  rows_for_format<VnniSums>(b);
}

}  // namespace freetoken
