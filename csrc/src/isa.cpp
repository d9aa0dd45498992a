// Runtime CPU detection and the name <-> variant mapping (compiled without ISA flags).
#include "freetoken/isa.h"

#include <stdexcept>

namespace freetoken {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512Bf16: return "avx512_bf16";
  }
  return "unknown";
}

Isa parse_isa(const std::string& name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Bf16}) {
    if (name == isa_name(isa)) return isa;
  }
  throw std::invalid_argument("unknown CPU MoE ISA '" + name +
                              "'; expected one of: scalar, avx2, avx512_bf16");
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out{Isa::kScalar};
#if defined(__x86_64__) || defined(__i386__)
  // __builtin_cpu_supports also checks that the OS saves the wide registers (XGETBV).
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (avx2) out.push_back(Isa::kAvx2);
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16")) {
    out.push_back(Isa::kAvx512Bf16);
  }
#endif
  return out;
}

Isa best_isa() { return supported_isas().back(); }

VecLayout vec_layout_for(Isa isa, WeightFormat format) {
  // Mirrors rows_dot_for: the avx512_bf16 variant runs the AVX2 code for non-bf16 formats.
  if (isa == Isa::kScalar || format == WeightFormat::kFp32) return VecLayout::kNatural;
  if (format == WeightFormat::kBf16) {
    return isa == Isa::kAvx512Bf16 ? VecLayout::kNatural : VecLayout::kEvenOdd16;
  }
  return VecLayout::kNibble16;  // mxfp4, q4g on avx2 / avx512_bf16
}

void pack_vector(VecLayout layout, const float* src, float* dst, int64_t k) {
  int64_t c = 0;
  if (layout != VecLayout::kNatural) {
    for (; c + 16 <= k; c += 16) {
      for (int p = 0; p < 16; ++p) {
        // kEvenOdd16: position p holds column 2p (p < 8) or 2(p - 8) + 1.
        // kNibble16: position p = 8a + 4b + d holds column 4d + b + 2a.
        const int col = layout == VecLayout::kEvenOdd16
                            ? (p < 8 ? 2 * p : 2 * (p - 8) + 1)
                            : 4 * (p % 4) + (p / 4) % 2 + 2 * (p / 8);
        dst[c + p] = src[c + col];
      }
    }
  }
  for (; c < k; ++c) dst[c] = src[c];
}

RowsDotFn rows_dot_for(Isa isa, WeightFormat format) {
  const bool q4 = format == WeightFormat::kMxfp4 || format == WeightFormat::kQ4g;
  if (isa == Isa::kScalar) {
    if (q4) return &rows_dot_q4_scalar;
    return format == WeightFormat::kFp32 ? &rows_dot_f32_scalar : &rows_dot_bf16_scalar;
  }
  if (isa == Isa::kAvx512Bf16 && format == WeightFormat::kBf16) return &rows_dot_bf16_avx512;
  if (q4) return &rows_dot_q4_avx2;
  return format == WeightFormat::kFp32 ? &rows_dot_f32_avx2 : &rows_dot_bf16_avx2;
}

RowsDotFn rows_dot_q8_for(Isa isa, WeightFormat format) {
  if (format != WeightFormat::kMxfp4 && format != WeightFormat::kQ4g) {
    throw std::invalid_argument("q8 activations need 4-bit weights (mxfp4 or q4g)");
  }
  return isa == Isa::kScalar ? &rows_dot_q8_scalar : &rows_dot_q8_avx2;
}

}  // namespace freetoken
