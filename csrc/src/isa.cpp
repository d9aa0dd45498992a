// Runtime CPU detection and the name <-> variant mapping (compiled without ISA flags).
#include "freetoken/isa.h"

#include <array>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

namespace freetoken {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512_bf16";
  }
  return "unknown";
}

Isa parse_isa(const std::string& name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (name == isa_name(isa)) return isa;
  }
  throw std::invalid_argument("unknown CPU MoE ISA '" + name +
                              "'; expected one of: scalar, avx2, avx512, avx512_bf16");
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out{Isa::kScalar};
#if defined(__x86_64__) || defined(__i386__)
  // __builtin_cpu_supports also checks that the OS saves the wide registers (XGETBV).
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (avx2) out.push_back(Isa::kAvx2);
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  if (avx512) out.push_back(Isa::kAvx512);
  if (avx512 && __builtin_cpu_supports("avx512bf16")) out.push_back(Isa::kAvx512Bf16);
#endif
  return out;
}

Isa best_isa() { return supported_isas().back(); }

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    const std::vector<Isa> isas = supported_isas();
    return isas.back() >= Isa::kAvx512 && __builtin_cpu_supports("avx512vnni");
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx512_vbmi() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    const std::vector<Isa> isas = supported_isas();
    return isas.back() >= Isa::kAvx512Bf16 && __builtin_cpu_supports("avx512vbmi");
  }();
  return has;
#else
  return false;
#endif
}

int64_t vec_layout_block(VecLayout layout) {
  switch (layout) {
    case VecLayout::kNatural: return 1;
    case VecLayout::kEvenOdd16:
    case VecLayout::kNibble16: return 16;
    case VecLayout::kEvenOdd32: return 32;
  }
  return 1;
}

void widen_bf16(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;  // a bf16 is the top half of an fp32
    std::memcpy(dst + i, &u, sizeof(float));
  }
}

void round_to_bf16(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = round_to_bf16(v[i]);
}

void pack_vector(VecLayout layout, const float* src, float* dst, int64_t k) {
  const int64_t block = vec_layout_block(layout);
  int64_t c = 0;
  if (block > 1) {
    const int64_t half = block / 2;
    for (; c + block <= k; c += block) {
      for (int64_t p = 0; p < block; ++p) {
        // kEvenOdd16 / kEvenOdd32: position p holds column 2p (p < half) or 2(p - half) + 1.
        // kNibble16: position p = 8a + 4b + d holds column 4d + b + 2a.
        const int64_t col = layout == VecLayout::kNibble16
                                ? 4 * (p % 4) + (p / 4) % 2 + 2 * (p / 8)
                                : (p < half ? 2 * p : 2 * (p - half) + 1);
        dst[c + p] = src[c + col];
      }
    }
  }
  for (; c < k; ++c) dst[c] = src[c];
}

namespace {

enum KernelId : int {
  kBf16Scalar, kF32Scalar, kQ4Scalar, kQ8Scalar,
  kBf16Avx2, kF32Avx2, kQ4Avx2, kQ8Avx2,
  kBf16Avx512, kF32Avx512, kBf16Dpbf16,
  kFp8Scalar, kFp8Avx2, kNvfp4Scalar, kNvfp4Avx2, kFp8Avx512, kQ8Avx512, kFp8Dpbf16,
  kNumKernels,
};

std::array<std::atomic<uint64_t>, kNumKernels> g_kernel_uses{};

}  // namespace

const std::vector<RowsKernel>& all_rows_kernels() {
  static const std::vector<RowsKernel> kernels = {
      {kBf16Scalar, &rows_dot_bf16_scalar, VecLayout::kNatural, "bf16_scalar", Isa::kScalar},
      {kF32Scalar, &rows_dot_f32_scalar, VecLayout::kNatural, "f32_scalar", Isa::kScalar},
      {kQ4Scalar, &rows_dot_q4_scalar, VecLayout::kNatural, "q4_scalar", Isa::kScalar},
      {kQ8Scalar, &rows_dot_q8_scalar, VecLayout::kNatural, "q8_scalar", Isa::kScalar},
      {kBf16Avx2, &rows_dot_bf16_avx2, VecLayout::kEvenOdd16, "bf16_avx2", Isa::kAvx2},
      {kF32Avx2, &rows_dot_f32_avx2, VecLayout::kNatural, "f32_avx2", Isa::kAvx2},
      {kQ4Avx2, &rows_dot_q4_avx2, VecLayout::kNibble16, "q4_avx2", Isa::kAvx2},
      {kQ8Avx2, &rows_dot_q8_avx2, VecLayout::kNatural, "q8_avx2", Isa::kAvx2},
      {kBf16Avx512, &rows_dot_bf16_avx512, VecLayout::kEvenOdd32, "bf16_avx512", Isa::kAvx512},
      {kF32Avx512, &rows_dot_f32_avx512, VecLayout::kNatural, "f32_avx512", Isa::kAvx512},
      {kBf16Dpbf16, &rows_dot_bf16_dpbf16, VecLayout::kNatural, "bf16_dpbf16", Isa::kAvx512Bf16},
      {kFp8Scalar, &rows_dot_fp8_scalar, VecLayout::kNatural, "fp8_scalar", Isa::kScalar},
      {kFp8Avx2, &rows_dot_fp8_avx2, VecLayout::kNatural, "fp8_avx2", Isa::kAvx2},
      {kNvfp4Scalar, &rows_dot_nvfp4_scalar, VecLayout::kNatural, "nvfp4_scalar", Isa::kScalar},
      {kNvfp4Avx2, &rows_dot_nvfp4_avx2, VecLayout::kNibble16, "nvfp4_avx2", Isa::kAvx2},
      {kFp8Avx512, &rows_dot_fp8_avx512, VecLayout::kNatural, "fp8_avx512", Isa::kAvx512},
      {kQ8Avx512, &rows_dot_q8_avx512, VecLayout::kNatural, "q8_avx512_vnni", Isa::kAvx512},
      {kFp8Dpbf16, &rows_dot_fp8_dpbf16, VecLayout::kNatural, "fp8_dpbf16", Isa::kAvx512Bf16},
  };
  return kernels;
}

const RowsKernel& rows_kernel_for(Isa isa, WeightFormat format, Activations act) {
  const auto& k = all_rows_kernels();
  if (format == WeightFormat::kFp8) {
    if (act == Activations::kQ8) {
      throw std::invalid_argument("fp8 weights take fp32 or bf16 activations");
    }
    if (act == Activations::kBf16 && isa == Isa::kAvx512Bf16 && cpu_has_avx512_vbmi()) {
      return k[kFp8Dpbf16];
    }
    return k[isa == Isa::kScalar ? kFp8Scalar : isa == Isa::kAvx2 ? kFp8Avx2 : kFp8Avx512];
  }
  if (format == WeightFormat::kNvfp4) {
    if (act != Activations::kFp32) {
      throw std::invalid_argument("nvfp4 weights take fp32 activations only");
    }
    return k[isa == Isa::kScalar ? kNvfp4Scalar : kNvfp4Avx2];
  }
  const bool q4 = format == WeightFormat::kMxfp4 || format == WeightFormat::kQ4g;
  if (act == Activations::kQ8) {
    if (!q4) throw std::invalid_argument("q8 activations need 4-bit weights (mxfp4 or q4g)");
    if (isa == Isa::kScalar) return k[kQ8Scalar];
    const bool avx512 = isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16;
    return k[avx512 && cpu_has_avx512_vnni() ? kQ8Avx512 : kQ8Avx2];
  }
  const bool bf16 = format == WeightFormat::kBf16;
  switch (isa) {
    case Isa::kScalar: return k[q4 ? kQ4Scalar : bf16 ? kBf16Scalar : kF32Scalar];
    case Isa::kAvx2: return k[q4 ? kQ4Avx2 : bf16 ? kBf16Avx2 : kF32Avx2];
    case Isa::kAvx512Bf16:
      if (bf16 && act == Activations::kBf16) return k[kBf16Dpbf16];
      [[fallthrough]];
    case Isa::kAvx512: return k[q4 ? kQ4Avx2 : bf16 ? kBf16Avx512 : kF32Avx512];
  }
  throw std::invalid_argument("unknown CPU MoE ISA");
}

void note_kernel_use(const RowsKernel& kernel) {
  g_kernel_uses[kernel.id].fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> kernel_use_counts() {
  std::vector<uint64_t> out;
  for (const auto& c : g_kernel_uses) out.push_back(c.load(std::memory_order_relaxed));
  return out;
}

}  // namespace freetoken
