// Portable variant of rows_dot: fp32 products and sums, no SIMD intrinsics.
#include <cstring>

#include "freetoken/isa.h"

namespace freetoken {

namespace {
inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
}  // namespace

void rows_dot_scalar(const RowsDotArgs& a) {
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    const uint16_t* row = a.w + r * a.w_stride;
    for (int64_t i = 0; i < a.num_vecs; ++i) {
      const float* v = a.vecs[i];
      float acc = 0.0f;
      for (int64_t k = 0; k < a.k; ++k) acc += bf16_to_f32(row[k]) * v[k];
      a.out[i * a.out_stride + (r - a.row_begin)] = acc;
    }
  }
}

}  // namespace freetoken
