// Portable variants of rows_dot for dense weights (bf16, fp32): fp32 products and sums, no SIMD.
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

inline float to_f32(uint16_t bf16_bits) { return bf16_to_f32(bf16_bits); }
inline float to_f32(float v) { return v; }

template <typename T>
void rows_dot_dense(const RowsDotArgs& a) {
  const T* w = static_cast<const T*>(a.w);
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    const T* row = w + r * a.k;
    for (int64_t i = 0; i < a.num_vecs; ++i) {
      const float* v = a.vecs[i];
      float acc = 0.0f;
      for (int64_t k = 0; k < a.k; ++k) acc += to_f32(row[k]) * v[k];
      a.out[i * a.out_stride + (r - a.row_begin)] = acc;
    }
  }
}

}  // namespace

void rows_dot_bf16_scalar(const RowsDotArgs& a) { rows_dot_dense<uint16_t>(a); }
void rows_dot_f32_scalar(const RowsDotArgs& a) { rows_dot_dense<float>(a); }

}  // namespace freetoken
