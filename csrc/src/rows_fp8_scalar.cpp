// Portable variants of rows_dot for the fp8 and nvfp4 formats: every weight is decoded through an
// exact fp32 table (freetoken/fp8.h), each block's partial dot product is summed in fp32 in
// column order and scaled once; nvfp4 multiplies the row's sum by its row scale. No SIMD, no
// dequantised copy.
#include "freetoken/fp8.h"
#include "freetoken/isa.h"

namespace freetoken {

// fp8: sum over column blocks b of scale[r / bm, b] * sum_{c in b} e4m3(v[r, c]) * x[c].
void rows_dot_fp8_scalar(const RowsDotArgs& a) {
  const auto* codes = static_cast<const uint8_t*>(a.w);
  const auto* scales = static_cast<const float*>(a.scales);
  const int64_t blocks = ceil_div(a.k, a.block_cols);
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    const uint8_t* row = codes + r * a.k;
    const float* srow = scales + (r / a.block_rows) * blocks;
    for (int64_t i = 0; i < a.num_vecs; ++i) {
      const float* v = a.vecs[i];
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t c0 = b * a.block_cols;
        const int64_t c1 = c0 + a.block_cols < a.k ? c0 + a.block_cols : a.k;
        float part = 0.0f;
        for (int64_t c = c0; c < c1; ++c) part += kE4m3.v[row[c]] * v[c];
        acc += srow[b] * part;
      }
      a.out[i * a.out_stride + (r - a.row_begin)] = acc;
    }
  }
}

// nvfp4: row_scale[r] * sum over groups g of e4m3(s[r, g]) * sum_{c in g} e2m1(code) * x[c].
void rows_dot_nvfp4_scalar(const RowsDotArgs& a) {
  const auto* codes = static_cast<const uint8_t*>(a.w);
  const auto* scales = static_cast<const uint8_t*>(a.scales);
  const int64_t groups = a.k / 16;
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    const uint8_t* row = codes + r * (a.k / 2);
    for (int64_t i = 0; i < a.num_vecs; ++i) {
      const float* v = a.vecs[i];
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* b = row + g * 8;
        const float* vg = v + g * 16;
        float part = 0.0f;
        for (int j = 0; j < 8; ++j) {
          part += kE2m1[b[j] & 0x0F] * vg[2 * j];
          part += kE2m1[b[j] >> 4] * vg[2 * j + 1];
        }
        acc += kE4m3.v[scales[r * groups + g]] * part;
      }
      a.out[i * a.out_stride + (r - a.row_begin)] = acc * a.row_scales[r];
    }
  }
}

}  // namespace freetoken
