// AVX512_BF16 + AVX512_VBMI variant of rows_dot for fp8 weights (float8 e4m3fn, fp32 block
// scales) with bf16 activations (Activations::kBf16): e4m3 codes become bf16 weights by a table
// lookup and vdpbf16ps sums the products, 64 weights per step.
//
// Decode of 64 codes (one 64-byte load): every e4m3 value has at most 4 significant bits, so it
// is exact in bf16; vpermi2b looks the low 7 bits of each code up in two 128-byte tables (the
// high and the low byte of the bf16 pattern of the positive value; code 0x7F, NaN, gives a bf16
// NaN), the code's sign bit is or-ed into the high byte, and vpunpck{l,h}bw interleave the bytes
// into two vectors of 32 bf16 words: per 128-bit lane L, columns 16L + 0..7 and 16L + 8..15 of
// the 64. The vectors are rounded to bf16 by the caller (moe.cpp) and reordered the same way once
// per call. bf16 x bf16 products are exact in fp32, so, as in the fp32-activation kernels, only
// the fp32 additions round (in another order; vdpbf16ps also flushes denormal inputs and outputs
// to zero); each column block's sum is multiplied by its scale into the row's accumulator. A
// block's columns that do not fill 64 are read with masked loads (code 0 and vector 0 beyond
// them), never past a row. Rows stream one at a time (one sequential read, as in the dense
// decode kernels) against up to 4 vectors; more vectors re-read the row per group of 4 from the
// cache.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mavx512vbmi (see setup_ext.py);
// called only when the CPU reports them (rows_kernel_for, cpu_has_avx512_vbmi).
// NOTE: no shared inline/template symbols here (see rows_dot_avx2.cpp).
// NOTE: GCC 12 warns (-Wuninitialized) inside its own avx512fintrin.h on _mm256_undefined_*().
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "freetoken/fp8.h"
#include "freetoken/isa.h"

namespace freetoken {

namespace {

constexpr int64_t kChunk = 64;  // columns per decode step
constexpr int kMaxVecs = 4;     // vectors per pass over a row

// The bf16 patterns of the positive e4m3 codes 0..127, split into high and low bytes.
struct Bf16Tables {
  alignas(64) uint8_t hi[128];
  alignas(64) uint8_t lo[128];
};

const Bf16Tables& bf16_tables() {
  static const Bf16Tables t = [] {
    Bf16Tables r{};
    for (int c = 0; c < 128; ++c) {
      uint32_t bits;
      const float v = kE4m3.v[c];
      std::memcpy(&bits, &v, sizeof(bits));
      const uint16_t h = c == 0x7F ? uint16_t{0x7FC0} : static_cast<uint16_t>(bits >> 16);
      r.hi[c] = static_cast<uint8_t>(h >> 8);
      r.lo[c] = static_cast<uint8_t>(h & 0xFF);
    }
    return r;
  }();
  return t;
}

inline __mmask64 first_bytes(int64_t n) {
  return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
}

inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

// The call's vectors as bf16 words in the decode order: per column block, its chunks of 64
// columns (the last one zero padded), each as [16L + 0..7 for L = 0..3 | 16L + 8..15].
struct PackedVectors {
  const uint16_t* data;
  int64_t block_words;  // words per column block (its chunks times 64)
};

PackedVectors pack_vectors(const RowsDotArgs& a, int64_t blocks) {
  const int64_t bn = a.block_cols;
  const int64_t chunks = (bn + kChunk - 1) / kChunk;
  const int64_t block_words = chunks * kChunk, vec_words = blocks * block_words;
  thread_local std::vector<uint16_t> buf;
  if (buf.size() < static_cast<size_t>(a.num_vecs * vec_words)) buf.resize(a.num_vecs * vec_words);
  for (int64_t t = 0; t < a.num_vecs; ++t) {
    const float* x = a.vecs[t];
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * bn, c1 = c0 + bn < a.k ? c0 + bn : a.k;
      uint16_t* dst = buf.data() + t * vec_words + b * block_words;
      for (int64_t ch = 0; ch < chunks; ++ch) {
        for (int64_t w = 0; w < kChunk; ++w) {
          const int64_t lane = (w % 32) / 8, half = w / 32, j = w % 8;
          const int64_t c = c0 + ch * kChunk + 16 * lane + 8 * half + j;
          uint32_t bits = 0;
          if (c < c1) std::memcpy(&bits, x + c, sizeof(bits));  // a bf16 value: exact
          dst[ch * kChunk + w] = static_cast<uint16_t>(bits >> 16);
        }
      }
    }
  }
  return {buf.data(), block_words};
}

// Row r against vectors [t0, t0 + TB).
template <int TB>
inline void row_pass(const RowsDotArgs& a, int64_t r, int64_t blocks, const PackedVectors& pv,
                     int64_t t0, const __m512i tables[4]) {
  const int64_t bn = a.block_cols, k = a.k;
  const uint8_t* row = static_cast<const uint8_t*>(a.w) + r * k;
  const float* srow = static_cast<const float*>(a.scales) + (r / a.block_rows) * blocks;
  const int64_t vec_words = blocks * pv.block_words;
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[TB];
  for (int t = 0; t < TB; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * bn, c1 = c0 + bn < k ? c0 + bn : k;
    __m512 part[TB][2];
    for (int t = 0; t < TB; ++t) part[t][0] = part[t][1] = _mm512_setzero_ps();
    const uint16_t* xs = pv.data + (t0 * vec_words) + b * pv.block_words;
    for (int64_t c = c0; c < c1; c += kChunk) {
      const __m512i raw = _mm512_maskz_loadu_epi8(first_bytes(c1 - c), row + c);
      __m512i hi = _mm512_permutex2var_epi8(tables[0], raw, tables[1]);
      hi = _mm512_ternarylogic_epi32(hi, raw, sign, 0xF8);  // hi | (raw & 0x80)
      const __m512i lo = _mm512_permutex2var_epi8(tables[2], raw, tables[3]);
      const __m512bh w0 = (__m512bh)_mm512_unpacklo_epi8(lo, hi);
      const __m512bh w1 = (__m512bh)_mm512_unpackhi_epi8(lo, hi);
      const int64_t at = c - c0;
      for (int t = 0; t < TB; ++t) {
        const uint16_t* x = xs + t * vec_words + at;
        part[t][0] = _mm512_dpbf16_ps(part[t][0], w0, (__m512bh)_mm512_loadu_si512(x));
        part[t][1] = _mm512_dpbf16_ps(part[t][1], w1, (__m512bh)_mm512_loadu_si512(x + 32));
      }
    }
    const __m512 s = _mm512_set1_ps(srow[b]);
    for (int t = 0; t < TB; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_add_ps(part[t][0], part[t][1]), s, acc[t]);
    }
  }
  for (int t = 0; t < TB; ++t) {
    a.out[(t0 + t) * a.out_stride + (r - a.row_begin)] = hsum16(acc[t]);
  }
}

}  // namespace

void rows_dot_fp8_dpbf16(const RowsDotArgs& a) {
  if (a.num_vecs <= 0 || a.row_end <= a.row_begin) return;
  const int64_t blocks = ceil_div(a.k, a.block_cols);
  const PackedVectors pv = pack_vectors(a, blocks);
  const Bf16Tables& tb = bf16_tables();
  const __m512i tables[4] = {_mm512_load_si512(tb.hi), _mm512_load_si512(tb.hi + 64),
                             _mm512_load_si512(tb.lo), _mm512_load_si512(tb.lo + 64)};
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    int64_t t = 0;
    for (; t + kMaxVecs <= a.num_vecs; t += kMaxVecs) {
      row_pass<kMaxVecs>(a, r, blocks, pv, t, tables);
    }
    switch (a.num_vecs - t) {
      case 3: row_pass<3>(a, r, blocks, pv, t, tables); break;
      case 2: row_pass<2>(a, r, blocks, pv, t, tables); break;
      case 1: row_pass<1>(a, r, blocks, pv, t, tables); break;
      default: break;
    }
  }
}

}  // namespace freetoken
