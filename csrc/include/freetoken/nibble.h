// Decoding of the two 4-bit weight formats, shared by the scalar and AVX2 variants.
//
// Both formats are read the same way: a group of `group` columns holds 4-bit codes c (two per
// byte, low nibble = even column) and the group's weights are  w = lut[c] * scale  with a
// 16-entry int8 table and one fp32 scale per (row, group):
//   mxfp4: lut = 2 * e2m1(c) = {0,1,2,3,4,6,8,12, 0,-1,-2,-3,-4,-6,-8,-12}, scale = 2^(s-128)
//          (s the E8M0 byte; 2 * e2m1 is an integer, so 2^(s-128) * lut = e2m1 * 2^(s-127)).
//   q4g:   lut = c - z (z the zero point, 8 when symmetric), scale = fp16 scale widened.
// Every product lut * scale is exact in fp32, so dequantising is exact. Every lut value (also
// c - z for any uint8 z) is an integer of magnitude <= 256, exact in bf16, which the AVX2 decode
// uses (ByteLut below).
// NOTE: static functions and constants only (internal linkage): this header is included by files
// compiled with different -m flags, and a shared inline symbol could be resolved to an AVX copy.
#pragma once

#include <cstdint>
#include <cstring>

namespace freetoken {

static constexpr int8_t kMxfp4Lut[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

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

// bf16 bit pattern of the integer v, |v| <= 256 (exact: at most 8 significant bits).
static constexpr uint16_t bf16_of_int(int v) {
  if (v == 0) return 0;
  const int m = v < 0 ? -v : v;
  int e = 0;
  while ((m >> (e + 1)) != 0) ++e;  // floor(log2 m)
  const int frac = (e <= 7 ? m << (7 - e) : m >> (e - 7)) & 0x7F;
  return static_cast<uint16_t>((v < 0 ? 0x8000 : 0) | ((127 + e) << 7) | frac);
}

// A 16-entry value table as two byte tables (for vpshufb): the low and the high byte of each
// value's bf16 bit pattern.
struct ByteLut {
  uint8_t lo[16];
  uint8_t hi[16];
};

static constexpr ByteLut make_lut(const int (&values)[16]) {
  ByteLut t{};
  for (int c = 0; c < 16; ++c) {
    const uint16_t b = bf16_of_int(values[c]);
    t.lo[c] = static_cast<uint8_t>(b & 0xFF);
    t.hi[c] = static_cast<uint8_t>(b >> 8);
  }
  return t;
}

static constexpr ByteLut make_mxfp4_lut() {
  int v[16] = {};
  for (int c = 0; c < 16; ++c) v[c] = kMxfp4Lut[c];
  return make_lut(v);
}

struct Q4gLuts {
  ByteLut zero_point[256];  // [z]: values c - z, c = 0..15
};

static constexpr Q4gLuts make_q4g_luts() {
  Q4gLuts t{};
  for (int z = 0; z < 256; ++z) {
    int v[16] = {};
    for (int c = 0; c < 16; ++c) v[c] = c - z;
    t.zero_point[z] = make_lut(v);
  }
  return t;
}

static constexpr ByteLut kMxfp4Bytes = make_mxfp4_lut();
static constexpr Q4gLuts kQ4gBytes = make_q4g_luts();

}  // namespace freetoken
