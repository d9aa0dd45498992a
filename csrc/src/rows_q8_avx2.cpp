// AVX2 + FMA + F16C variant of the q8 rows_dot for the 4-bit formats (mxfp4, q4g): int8
// activations (freetoken/q8.h, Q8Layout::kPair64) times the 4-bit weights' integers, exact int32
// per 32-column block, then one fp32 FMA per 8 blocks.
//
// Per 32 code bytes (two blocks, 64 columns): one load; `& 0x0F` gives the low nibbles (even
// columns of both blocks, one block per 128-bit lane) and `(>> 4) & 0x0F` the high ones (odd
// columns). The activations sit in exactly that order (kPair64), so no weight is shuffled.
// vpmaddubsw needs an unsigned operand, so the weights enter as u = w + o >= 0 and the block sum
// is corrected by o * sum(q) (sum(q) per block comes with the vector):
//   mxfp4: u = 2 * e2m1(c) + 12 in [0, 24] by one vpshufb per nibble vector, o = 12;
//   q4g:   u = c (the nibble itself, no table), o = z (8 when symmetric, else the group's zero).
// Two vpmaddubsw (even / odd columns) + vpaddw give 16 int16 partial sums per pair of blocks
// (|.| <= 2 * 2 * 24 * 127 = 12192; no saturation). A 256-column chunk (8 blocks, 4 pairs) is
// reduced to its 8 block sums: pairs (0, 1) and (2, 3) folded by vpunpck{l,h}qdq + vpaddw (|.| <=
// 24384), vpmaddwd with ones, then vshufps + vpaddd give lanes [b0 b2 b4 b6 | b1 b3 b5 b7] (the
// kPair64 slot order). isum = that - o * sum(q) (vpmulld; once per chunk and vector when o is
// fixed), exact for every uint8 zero point (u stays the nibble, the correction is int32); then
//   acc = fma(cvt(isum), d_x * d_w, acc)   with d_x, d_w the 8 blocks' activation and weight scales
// (d_w: 8 E8M0 or fp16 scales decoded at once and permuted into slot order when groups are 32
// columns; scalar otherwise). A last chunk of fewer than 8 blocks reads only its own bytes
// (unpaired last block: 16-byte loads into the low lane), its missing lanes are zero.
// Tiles: RB rows x TB vectors (1 x 4, 1 x 2, 2 x 1), chunk by chunk; each decoded nibble vector
// serves the TB vectors, each chunk's activation data the RB rows. Each tile prefetches the codes
// kPrefetchRows rows on and, once, that row block's scales and zero points.
// Measured on the 2-core AVX2 (Zen 3) test machine, one thread, data in L2: 26 (mxfp4) and 35
// (q4g) weights/ns against 13 for the fp32-activation code (rows_q4_avx2.cpp).
// Compiled with -mavx2 -mfma -mf16c only; called only when the CPU reports all three.
// NOTE: no shared inline/template symbols (see rows_dot_avx2.cpp): helpers are file-local.
#include <immintrin.h>

#include <cstdint>

#include "freetoken/isa.h"
#include "freetoken/nibble.h"
#include "freetoken/q8.h"

namespace freetoken {

namespace {

#include "rows_q8_impl.h"

// Full chunks by chunk_sums (vpmaddubsw + vpmaddwd).
struct PairSums {
  template <bool kMx, int RB, int TB>
  static void sums(const uint8_t* const* rows, const int8_t* const* xs, __m256i lut,
                   __m256i (*out)[TB]) {
    chunk_sums<kMx, true, RB, TB>(rows, xs, kQ8ChunkBlocks, lut, out);
  }
};

}  // namespace

void rows_dot_q8_avx2(const RowsDotArgs& a) { rows_for_format<PairSums>(a); }

}  // namespace freetoken
