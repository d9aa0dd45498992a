// float8 e4m3fn (OCP 8-bit floating point E4M3, torch.float8_e4m3fn) decoded to fp32, shared by
// the fp8 weights and the nvfp4 block scales.
//
// Bit 7 sign, bits 3-6 exponent e (bias 7), bits 0-2 mantissa m: e >= 1 is (1 + m/8) * 2^(e-7),
// e = 0 the subnormal m/8 * 2^-6; S.1111.111 (0x7F, 0xFF) is NaN; there are no infinities and
// the largest finite magnitude is 448. Every value has at most 4 significant bits, so the
// 256-entry fp32 table is exact.
// NOTE: static constants only (internal linkage), as in nibble.h: this header is included by
// files compiled with different -m flags.
#pragma once

#include <cstdint>

namespace freetoken {

static constexpr float e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 0x7;
  if (e == 0xF && m == 0x7) return __builtin_nanf("");
  float v = e == 0 ? static_cast<float>(m) / 8.0f : 1.0f + static_cast<float>(m) / 8.0f;
  for (int i = 0; i < (e == 0 ? 6 : 7 - e); ++i) v /= 2.0f;  // powers of two: exact
  for (int i = 0; i < e - 7; ++i) v *= 2.0f;
  return (b & 0x80) ? -v : v;
}

struct E4m3Table {
  float v[256];
};

static constexpr E4m3Table make_e4m3_table() {
  E4m3Table t{};
  for (int b = 0; b < 256; ++b) t.v[b] = e4m3_to_f32(static_cast<uint8_t>(b));
  return t;
}

static constexpr E4m3Table kE4m3 = make_e4m3_table();

// e2m1 (FP4) value of a 4-bit code: bit 3 sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
static constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Number of blocks of `block` covering n (the last one may be partial).
static constexpr int64_t ceil_div(int64_t n, int64_t block) { return (n + block - 1) / block; }

}  // namespace freetoken
