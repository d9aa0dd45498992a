// Block quantisation of activations to int8 ("q8", see freetoken/q8.h); compiled without ISA flags.
#include "freetoken/q8.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace freetoken {

namespace {

// Round half to even of |v| < 2^22 in the default rounding mode, without libm: v + 1.5 * 2^23 has
// no fraction bits, so the addition itself rounds (to nearest, ties to even) and the subtraction
// is exact. (Built without -ffast-math, so the compiler keeps both operations.)
inline float round_half_even(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

inline int64_t slot_of(Q8Layout layout, int64_t b) {
  if (layout == Q8Layout::kNatural) return b;
  return kQ8ChunkBlocks * (b / kQ8ChunkBlocks) + 4 * (b % 2) + (b % kQ8ChunkBlocks) / 2;
}

// Byte of column j (0..31) of block b, in a vector of `blocks` blocks.
inline int64_t pos_of(Q8Layout layout, int64_t b, int64_t blocks, int64_t j) {
  if (layout == Q8Layout::kNatural) return kQ8Block * b + j;
  const int64_t base = 64 * (b / 2);
  if (b % 2 == 0 && b + 1 == blocks) return base + (j % 2) * 16 + j / 2;  // unpaired last block
  return base + (j % 2) * 32 + (b % 2) * 16 + j / 2;
}

}  // namespace

Q8Layout q8_layout_for(Isa isa) {
  return isa == Isa::kScalar ? Q8Layout::kNatural : Q8Layout::kPair64;
}

int64_t q8_scale_slots(int64_t k) {
  const int64_t blocks = k / kQ8Block;
  return (blocks + kQ8ChunkBlocks - 1) / kQ8ChunkBlocks * kQ8ChunkBlocks;
}

void quantize_q8(Q8Layout layout, const float* src, int64_t c0, int64_t c1, int64_t k, int8_t* q,
                 float* d, int32_t* sums) {
  if (k % kQ8Block != 0 || c0 % kQ8Block != 0 || c1 % kQ8Block != 0 || c0 < 0 || c1 > k ||
      c0 > c1) {
    throw std::invalid_argument("quantize_q8: columns [" + std::to_string(c0) + ", " +
                                std::to_string(c1) + ") of " + std::to_string(k) +
                                " must be whole blocks of 32");
  }
  const int64_t blocks = k / kQ8Block;
  for (int64_t b = c0 / kQ8Block; b < c1 / kQ8Block; ++b) {
    const float* v = src + (b * kQ8Block - c0);
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < kQ8Block; ++j) {
      finite = finite && std::isfinite(v[j]);
      amax = std::fmax(amax, std::fabs(v[j]));
    }
    const float scale = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    int32_t sum = 0;
    for (int j = 0; j < kQ8Block; ++j) {
      int32_t qi = 0;
      if (finite && amax > 0.0f) {
        const float r = round_half_even(v[j] / scale);
        qi = r > 127.0f ? 127 : (r < -127.0f ? -127 : static_cast<int32_t>(r));
      }
      q[pos_of(layout, b, blocks, j)] = static_cast<int8_t>(qi);
      sum += qi;
    }
    d[slot_of(layout, b)] = scale;
    sums[slot_of(layout, b)] = sum;
  }
}

Q8Rows::Q8Rows(Q8Layout layout, int64_t rows, int64_t k)
    : layout_(layout),
      k_(k),
      slots_(q8_scale_slots(k)),
      q_(rows * k),
      d_(rows * q8_scale_slots(k)),
      sums_(rows * q8_scale_slots(k)) {}

void Q8Rows::quantize(int64_t row, const float* src, int64_t c0, int64_t c1) {
  quantize_q8(layout_, src, c0, c1, k_, q_.data() + row * k_, d_.data() + row * slots_,
              sums_.data() + row * slots_);
}

Q8Vec Q8Rows::vec(int64_t row) const {
  Q8Vec v;
  v.q = q_.data() + row * k_;
  v.d = d_.data() + row * slots_;
  v.sums = sums_.data() + row * slots_;
  return v;
}

}  // namespace freetoken
