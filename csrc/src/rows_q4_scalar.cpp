// Portable variant of rows_dot for the 4-bit formats (mxfp4, q4g): each group's codes are decoded
// through its int8 table (freetoken/nibble.h), the group's partial dot product is summed in fp32
// and scaled once: sum_g scale_g * sum_{k in g} lut_g[c_k] * v_k. No SIMD, no dequant buffer.
#include "freetoken/isa.h"
#include "freetoken/nibble.h"

namespace freetoken {

namespace {

// Table and scale of group g of row r (values as fp32: c - z spans [-255, 15] for uint8 z).
inline float group_lut(const RowsDotArgs& a, int64_t r, int64_t g, float lut[16]) {
  const int64_t groups = a.k / a.group, idx = r * groups + g;
  if (a.format == WeightFormat::kMxfp4) {
    for (int c = 0; c < 16; ++c) lut[c] = static_cast<float>(kMxfp4Lut[c]);
    return e8m0_half_scale(static_cast<const uint8_t*>(a.scales)[idx]);
  }
  const int z = a.zeros ? a.zeros[idx] : 8;
  for (int c = 0; c < 16; ++c) lut[c] = static_cast<float>(c - z);
  return fp16_bits_to_f32(static_cast<const uint16_t*>(a.scales)[idx]);
}

}  // namespace

void rows_dot_q4_scalar(const RowsDotArgs& a) {
  const auto* codes = static_cast<const uint8_t*>(a.w);
  const int64_t groups = a.k / a.group;
  float lut[16];
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    for (int64_t i = 0; i < a.num_vecs; ++i) a.out[i * a.out_stride + (r - a.row_begin)] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = group_lut(a, r, g, lut);
      const uint8_t* b = codes + r * (a.k / 2) + g * (a.group / 2);
      for (int64_t i = 0; i < a.num_vecs; ++i) {
        const float* v = a.vecs[i] + g * a.group;
        float acc = 0.0f;
        for (int64_t j = 0; j < a.group / 2; ++j) {
          acc += lut[b[j] & 0x0F] * v[2 * j];
          acc += lut[b[j] >> 4] * v[2 * j + 1];
        }
        a.out[i * a.out_stride + (r - a.row_begin)] += scale * acc;
      }
    }
  }
}

}  // namespace freetoken
