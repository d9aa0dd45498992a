// MXFP4 experts to dense fp32 / bf16 (freetoken/dequant.h): the scalar rows and the dispatch,
// compiled without ISA flags.
#include "freetoken/dequant.h"

#include <cstring>

namespace freetoken {

namespace {

constexpr int64_t kRowsPerTask = 64;

// The two values of each code byte (low nibble first), e2m1 magnitudes with bit 3 the sign.
struct PairLut {
  float v[256][2];
  PairLut() {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int b = 0; b < 256; ++b) {
      for (int h = 0; h < 2; ++h) {
        const int code = (b >> (4 * h)) & 15;
        v[b][h] = (code & 8) ? -mag[code & 7] : mag[code & 7];
      }
    }
  }
};

// 2^(s - 127) as fp32 bits: s << 23 for s >= 1 (255: inf), the subnormal 2^-127 for s == 0.
inline float e8m0(uint8_t s) {
  const uint32_t bits = s == 0 ? 0x00400000u : static_cast<uint32_t>(s) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

void dequantize_mxfp4_row_scalar(const uint8_t* codes, const uint8_t* scales, int64_t groups,
                                 bool bf16, void* out) {
  static const PairLut lut;
  for (int64_t g = 0; g < groups; ++g) {
    const float f = e8m0(scales[g]);
    float block[32];
    for (int j = 0; j < 16; ++j) {
      const float* pair = lut.v[codes[g * 16 + j]];
      block[2 * j] = pair[0] * f;
      block[2 * j + 1] = pair[1] * f;
    }
    if (bf16) {  // exact values (or inf / NaN): the top half of the fp32 bits is the bf16
      uint16_t* o = static_cast<uint16_t*>(out) + g * 32;
      for (int j = 0; j < 32; ++j) {
        uint32_t bits;
        std::memcpy(&bits, &block[j], sizeof bits);
        o[j] = static_cast<uint16_t>(bits >> 16);
      }
    } else {
      std::memcpy(static_cast<float*>(out) + g * 32, block, sizeof block);
    }
  }
}

void dequantize_mxfp4_experts(const uint8_t* blocks, const uint8_t* scales, int64_t rows,
                              int64_t cols, const int64_t* ids, int64_t n, bool bf16, void* out,
                              Isa isa, ThreadPool& pool) {
  auto row_fn = dequantize_mxfp4_row_scalar;
#if defined(__x86_64__) || defined(__i386__)
  if (isa != Isa::kScalar) row_fn = dequantize_mxfp4_row_avx2;
#endif
  const int64_t groups = cols / 32, width = bf16 ? 2 : 4;
  const int64_t chunks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  pool.parallel_for(n * chunks, [&](int64_t task) {
    const int64_t i = task / chunks, r0 = (task % chunks) * kRowsPerTask;
    const int64_t r1 = r0 + kRowsPerTask < rows ? r0 + kRowsPerTask : rows;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t src = ids[i] * rows + r, dst = (i * rows + r) * cols;
      row_fn(blocks + src * groups * 16, scales + src * groups, groups, bf16,
             static_cast<char*>(out) + dst * width);
    }
  });
}

}  // namespace freetoken
