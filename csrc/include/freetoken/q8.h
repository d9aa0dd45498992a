// Int8 activations ("q8") for the 4-bit weight formats: each activation vector entering an expert
// matrix (x for gate_up, silu(g) * u for down) is quantised per block of 32 columns, in the manner
// of llama.cpp's Q8_0 (ggml-quants.c, quantize_row_q8_0), so that a block's dot product with the
// 4-bit weights is an exact int32 sum of small-integer products (see RowsDotArgs in isa.h).
//
// Block quantisation (the torch reference is freetoken/ops/cpu_moe/reference_q8.py, bit-equal):
//   d = absmax / 127 (fp32 division), q = round-half-even(v / d) (fp32 division) clamped to
//   [-127, 127]; d = 0 gives q = 0; a block holding a NaN or an infinity gets d = NaN and q = 0,
//   so every output that reads it is NaN (as the fp32 path would give a non-finite value).
//
// Layouts (Q8Layout), for a vector of k columns (k a multiple of 32), B = k / 32 blocks:
//   kNatural: q in column order; block b's d and sum at slot b.
//   kPair64:  q: each pair of blocks (2m, 2m + 1) takes bytes [64m, 64m + 64) as the 16 even
//             columns of block 2m, the 16 even columns of block 2m + 1, the 16 odd columns of
//             block 2m, the 16 odd columns of block 2m + 1; a last block without a partner
//             (B odd) takes its 16 even columns, then its 16 odd ones. This is the order in which
//             the AVX2 code splits 32 code bytes into low and high nibbles (rows_q8_avx2.cpp).
//             Block b's d and sum sit at slot 8 * (b / 8) + 4 * (b % 2) + (b % 8) / 2, the lane
//             order in which that code reduces the 8 block sums of a 256-column chunk.
// Every position depends only on the block index, so a vector can be quantised in pieces of
// whole blocks. The d / sums arrays have q8_scale_slots(k) entries (B rounded up to a multiple of
// 8); slots of missing blocks stay 0.
#pragma once

#include <cstdint>
#include <vector>

#include "freetoken/isa.h"

namespace freetoken {

constexpr int64_t kQ8Block = 32;     // columns per quantisation block
constexpr int64_t kQ8ChunkBlocks = 8;  // blocks per slot chunk (kPair64 reduction width)

enum class Q8Layout : int { kNatural = 0, kPair64 = 1 };

// The layout rows_dot_q8_for(isa, format) reads (kNatural for scalar, kPair64 otherwise).
Q8Layout q8_layout_for(Isa isa);

// Entries of a vector's d / sums arrays: k / 32 rounded up to a multiple of 8.
int64_t q8_scale_slots(int64_t k);

// Quantises columns [c0, c1) of a k-column vector: src[0 : c1 - c0] are their fp32 values; writes
// their q (into the k-byte q) and their blocks' d and sums. c0, c1 multiples of 32 (c1 <= k).
// Portable code. Throws std::invalid_argument for misaligned bounds.
void quantize_q8(Q8Layout layout, const float* src, int64_t c0, int64_t c1, int64_t k, int8_t* q,
                 float* d, int32_t* sums);

// Storage of `rows` q8 vectors of k columns each in one layout (d and sums zero-initialised).
class Q8Rows {
 public:
  Q8Rows() = default;
  Q8Rows(Q8Layout layout, int64_t rows, int64_t k);

  // Quantises columns [c0, c1) of row `row` from src[0 : c1 - c0] (see quantize_q8).
  void quantize(int64_t row, const float* src, int64_t c0, int64_t c1);

  Q8Vec vec(int64_t row) const;

 private:
  Q8Layout layout_ = Q8Layout::kNatural;
  int64_t k_ = 0;
  int64_t slots_ = 0;
  std::vector<int8_t> q_;
  std::vector<float> d_;
  std::vector<int32_t> sums_;
};

}  // namespace freetoken
