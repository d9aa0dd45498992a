// Portable variant of the q8 rows_dot for the 4-bit formats (mxfp4, q4g) with int8 activations in
// Q8Layout::kNatural (freetoken/q8.h): per 32-column block the exact int32 sum of the weight
// integers (mxfp4: 2 * e2m1, q4g: c - z) times the activation integers, then
// acc += (float)isum * (d_block * weight_scale), blocks in column order. No SIMD.
#include "freetoken/isa.h"
#include "freetoken/nibble.h"
#include "freetoken/q8.h"

namespace freetoken {

namespace {

// Integer table and fp32 scale of group g of row r (c - z spans [-255, 15] for uint8 z).
inline float group_table(const RowsDotArgs& a, int64_t r, int64_t g, int32_t lut[16]) {
  const int64_t groups = a.k / a.group, idx = r * groups + g;
  if (a.format == WeightFormat::kMxfp4) {
    for (int c = 0; c < 16; ++c) lut[c] = kMxfp4Lut[c];
    return e8m0_half_scale(static_cast<const uint8_t*>(a.scales)[idx]);
  }
  const int32_t z = a.zeros ? a.zeros[idx] : 8;
  for (int c = 0; c < 16; ++c) lut[c] = c - z;
  return fp16_bits_to_f32(static_cast<const uint16_t*>(a.scales)[idx]);
}

}  // namespace

void rows_dot_q8_scalar(const RowsDotArgs& a) {
  const auto* codes = static_cast<const uint8_t*>(a.w);
  const int64_t groups = a.k / a.group, blocks_per_group = a.group / kQ8Block;
  int32_t lut[16];
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    for (int64_t i = 0; i < a.num_vecs; ++i) {
      const Q8Vec& v = a.qvecs[i];
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = group_table(a, r, g, lut);
        for (int64_t bg = 0; bg < blocks_per_group; ++bg) {
          const int64_t b = g * blocks_per_group + bg;
          const uint8_t* c = codes + r * (a.k / 2) + b * (kQ8Block / 2);
          const int8_t* q = v.q + b * kQ8Block;
          int32_t isum = 0;
          for (int64_t j = 0; j < kQ8Block / 2; ++j) {
            isum += lut[c[j] & 0x0F] * q[2 * j] + lut[c[j] >> 4] * q[2 * j + 1];
          }
          acc += static_cast<float>(isum) * (v.d[b] * scale);
        }
      }
      a.out[i * a.out_stride + (r - a.row_begin)] = acc;
    }
  }
}

}  // namespace freetoken
