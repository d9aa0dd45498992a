// Decoding of the two 4-bit weight formats, shared by the scalar and AVX2 variants.
//
// Both formats are read the same way: a group of `group` columns holds 4-bit codes c (two per
// byte, low nibble = even column) and the group's weights are  w = lut[c] * scale  with a
// 16-entry int8 table and one fp32 scale per (row, group):
//   mxfp4: lut = 2 * e2m1(c) = {0,1,2,3,4,6,8,12, 0,-1,-2,-3,-4,-6,-8,-12}, scale = 2^(s-128)
//          (s the E8M0 byte; 2 * e2m1 is an integer, so 2^(s-128) * lut = e2m1 * 2^(s-127)).
//   q4g:   lut = c - z (z the zero point, 8 when symmetric), scale = fp16 scale widened.
// Every product lut * scale is exact in fp32, so dequantising is exact.
// NOTE: static functions only (internal linkage): this header is included by files compiled with
// different -m flags, and a shared inline symbol could be resolved to an AVX copy.
#pragma once

#include <cstdint>
#include <cstring>

namespace freetoken {

static const int8_t kMxfp4Lut[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(s - 128) as fp32, s an E8M0 byte (s = 0, 1 give subnormals; s = 255 gives 2^127).
static inline float e8m0_half_scale(uint8_t s) {
  const uint32_t bits =
      s >= 2 ? static_cast<uint32_t>(s - 1) << 23 : (s == 1 ? 0x00400000u : 0x00200000u);
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// IEEE binary16 bits -> fp32 (exact; handles subnormals, inf, NaN).
static inline float fp16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(man & 0x400u)) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace freetoken
