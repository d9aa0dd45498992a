// Instruction-set variants of the CPU expert kernel, weight formats, and their runtime selection.
//
// Each variant lives in its own translation units (src/rows_*_<isa>.cpp) compiled with its own
// -m flags, so the module imports on any x86-64 CPU and only calls a variant the CPU reports.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace freetoken {

// kAvx512: AVX-512F/BW/VL (plus AVX2, FMA, F16C); kAvx512Bf16: that plus AVX512_BF16.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

// What the expert matrices multiply (see csrc/README.md):
//   kFp32: the fp32 activations as they are: exact products up to fp32 summation order.
//   kQ8:   int8 blocks of 32 columns (freetoken/q8.h), 4-bit weights only.
//   kBf16: the activations rounded to bf16 (round to nearest even) first, then fp32 sums of the
//          products; on kAvx512Bf16 with bf16 weights via vdpbf16ps, elsewhere through the fp32
//          kernel on the rounded values (the same numerical contract).
enum class Activations : int { kFp32 = 0, kQ8 = 1, kBf16 = 2 };

// How an expert bank stores its weights (see csrc/README.md "Weight formats").
//   kBf16, kFp32: dense values, row-major [rows, k].
//   kMxfp4: gpt-oss MXFP4: per row k/2 bytes of e2m1 codes (low nibble = even column) and k/32
//           E8M0 scale bytes (value 2^(s-127)); group = 32.
//   kQ4g: int4 codes q in [0, 15] packed like kMxfp4, one fp16 scale per `group` columns and
//         either a uint8 zero point z per group or, symmetric, z = 8: w = (q - z) * scale.
//   kFp8: float8 e4m3fn values, row-major [rows, k] bytes (freetoken/fp8.h), and one fp32 scale
//         per block of block_rows x block_cols (the last blocks of a row / column may be
//         partial): w[r, c] = e4m3(v[r, c]) * scale[r / block_rows, c / block_cols].
//   kNvfp4: NVIDIA ModelOpt NVFP4: e2m1 codes packed like kMxfp4 (low nibble = even column),
//         one e4m3fn scale byte per group of 16 columns and one fp32 scale per row (the
//         checkpoint's per-tensor weight_scale_2): w = e2m1(c) * e4m3(s) * row_scale.
enum class WeightFormat : int { kBf16 = 0, kFp32 = 1, kMxfp4 = 2, kQ4g = 3, kFp8 = 4, kNvfp4 = 5 };

// Short stable names used by the Python API and the FREETOKEN_CPU_MOE_ISA override.
const char* isa_name(Isa isa);

// Parses "scalar" / "avx2" / "avx512" / "avx512_bf16"; throws std::invalid_argument otherwise.
Isa parse_isa(const std::string& name);

// Variants this CPU and OS can run, best last (scalar is always first).
std::vector<Isa> supported_isas();

// The best supported variant.
Isa best_isa();

// Whether the CPU reports AVX512_VNNI (with the avx512 variant's features): the q8 kernel of
// the avx512 variants needs it.
bool cpu_has_avx512_vnni();

// Whether the CPU reports AVX512_VBMI with the avx512_bf16 variant's features: the fp8_dpbf16
// kernel needs both.
bool cpu_has_avx512_vbmi();

// Order in which a variant reads the k values of its fp32 vectors (the weights keep their stored
// order). A variant whose weight decode naturally yields columns in another order asks for the
// vectors in that order, so the permutation is paid once per vector, not once per weight row.
//   kNatural:   column order.
//   kEvenOdd16: within each full block of 16 columns, the 8 even columns then the 8 odd ones:
//               0 2 .. 14 1 3 .. 15 (AVX2 bf16 decode).
//   kNibble16:  within each full block of 16 columns: 0 4 8 12 1 5 9 13 2 6 10 14 3 7 11 15
//               (AVX2 4-bit decode, rows_q4_avx2.cpp).
//   kEvenOdd32: within each full block of 32 columns, the 16 even columns then the 16 odd ones
//               (AVX-512 bf16 decode, rows_dot_avx512.cpp).
// A trailing partial block stays in column order. Blocks start at column 0, so a segment
// [j0, j1) with j0 a multiple of the block (and j1 = k or a multiple of it) can be packed on its
// own.
enum class VecLayout : int { kNatural = 0, kEvenOdd16 = 1, kNibble16 = 2, kEvenOdd32 = 3 };

// Columns per block of `layout` (1 for kNatural).
int64_t vec_layout_block(VecLayout layout);

// dst[0:n] = the bf16 values whose bit patterns are src[0:n], as fp32 (exact). Portable code.
void widen_bf16(const uint16_t* src, float* dst, int64_t n);

// v rounded to the nearest bf16 value, ties to even (torch's float -> bfloat16), kept as fp32; a
// NaN stays a quiet NaN. The array form rounds v[0:n] in place. Portable code. Static (each
// translation unit its own copy, whatever ISA flags it is compiled with) so that the per-element
// callers in the decode ops inline it.
static inline float round_to_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  u = nan ? (u | 0x00400000u) : u + 0x7FFFu + ((u >> 16) & 1u);  // NaN stays a (quiet) NaN
  u &= 0xFFFF0000u;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}
void round_to_bf16(float* v, int64_t n);

// dst[0:k] = src[0:k] permuted into `layout` (dst != src). Portable code.
void pack_vector(VecLayout layout, const float* src, float* dst, int64_t k);

// One activation vector quantised to int8 per 32-column block ("q8", see freetoken/q8.h): the
// block's values q (in the variant's Q8Layout), its fp32 scale d (value = q * d) and the sum of its
// q, the last two in the layout's slot order (q8_scale_slots(k) entries, unused slots zero).
struct Q8Vec {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const int32_t* sums = nullptr;
};

// Arguments of the one ISA-specific primitive: dot products of weight rows with fp32 vectors.
//   out[i * out_stride + (r - row_begin)] = sum_k W[r, k] * vecs[i][k]
// for rows r in [row_begin, row_end) and vectors i in [0, num_vecs), where W is the [rows, k]
// matrix that w (and, for 4-bit formats, scales / zeros) encode in `format`. Rows are contiguous:
// row r starts at element r * k (dense, fp8) or byte r * k / 2 (4-bit; k is a multiple of
// `group`).
// The vectors are given in the kernel's layout (RowsKernel::layout; the sum is the same dot
// product, only the order in which its terms are added differs). Every kernel keeps fp32 sums;
// the vdpbf16ps kernel reads vectors that are already bf16 values (Activations::kBf16).
struct RowsDotArgs {
  WeightFormat format = WeightFormat::kBf16;
  const void* w = nullptr;          // bf16 bits / fp32 values / packed 4-bit codes of row 0
  const void* scales = nullptr;     // 4-bit: [rows, k / group] uint8 E8M0 (mxfp4) or fp16 bits
  const uint8_t* zeros = nullptr;   // q4g: [rows, k / group] zero points, or nullptr (z = 8)
  int64_t group = 0;                // 4-bit group size along k (32 mxfp4, 32 * m q4g, 16 nvfp4)
  int64_t k = 0;                    // reduction length (columns)
  int64_t row_begin = 0;
  int64_t row_end = 0;
  const float* const* vecs = nullptr;  // num_vecs pointers to k fp32 values each (VecLayout)
  const Q8Vec* qvecs = nullptr;        // q8 kernels only: num_vecs vectors
  int64_t num_vecs = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  // kFp8: `scales` is [ceil(rows / block_rows), ceil(k / block_cols)] fp32 (row 0 of the
  // matrix, not of row_begin). kNvfp4: `scales` is [rows, k / 16] e4m3fn bytes and
  // row_scales [rows] fp32.
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  const float* row_scales = nullptr;
};

using RowsDotFn = void (*)(const RowsDotArgs&);

void rows_dot_bf16_scalar(const RowsDotArgs& a);
void rows_dot_f32_scalar(const RowsDotArgs& a);
void rows_dot_q4_scalar(const RowsDotArgs& a);   // kMxfp4 and kQ4g
void rows_dot_bf16_avx2(const RowsDotArgs& a);
void rows_dot_f32_avx2(const RowsDotArgs& a);
void rows_dot_q4_avx2(const RowsDotArgs& a);     // kMxfp4 and kQ4g
void rows_dot_bf16_avx512(const RowsDotArgs& a);  // AVX-512F, VecLayout::kEvenOdd32
void rows_dot_f32_avx512(const RowsDotArgs& a);   // AVX-512F, VecLayout::kNatural
void rows_dot_bf16_dpbf16(const RowsDotArgs& a);  // AVX512_BF16, bf16-valued vectors, kNatural
// fp8 and nvfp4 (fp32 activations only): per row, the fp32 dot product of each block's decoded
// weights (e4m3 / e2m1 values, exact in fp32) with the vector, times the block's scale, summed
// over the blocks; nvfp4 then multiplies the row's sum by its row scale.
void rows_dot_fp8_scalar(const RowsDotArgs& a);    // kNatural
void rows_dot_fp8_avx2(const RowsDotArgs& a);      // AVX2 + F16C, kNatural
void rows_dot_fp8_avx512(const RowsDotArgs& a);    // AVX-512F/BW/VL, kNatural
// fp8 with bf16-valued vectors (Activations::kBf16): vdpbf16ps over the e4m3 weights as bf16.
void rows_dot_fp8_dpbf16(const RowsDotArgs& a);    // AVX512_BF16 + AVX512_VBMI, kNatural
void rows_dot_nvfp4_scalar(const RowsDotArgs& a);  // kNatural
void rows_dot_nvfp4_avx2(const RowsDotArgs& a);    // AVX2 + F16C, kNibble16

// q8 activations (4-bit formats only; freetoken/q8.h): per 32-column block b of a row, the exact
// int32 sum of w_int * q over the block, then out += (float)isum * (d_b * w_scale), where the
// weight is w_int * w_scale (mxfp4: 2 * e2m1 and 2^(s - 128); q4g: c - z and the fp16 scale).
void rows_dot_q8_scalar(const RowsDotArgs& a);   // kMxfp4 and kQ4g, Q8Layout::kNatural
void rows_dot_q8_avx2(const RowsDotArgs& a);     // kMxfp4 and kQ4g, Q8Layout::kPair64
void rows_dot_q8_avx512(const RowsDotArgs& a);   // AVX512_VNNI, bit-identical to q8_avx2

// One implementation of the primitive: its function, the layout of the fp32 vectors it reads
// (unused by the q8 kernels, which read Q8Layout q8_layout_for(isa)), its stable name (reported
// by kernel_use_counts, e.g. "bf16_avx512") and the lowest variant whose ISA it needs.
struct RowsKernel {
  int id = 0;
  RowsDotFn fn = nullptr;
  VecLayout layout = VecLayout::kNatural;
  const char* name = "";
  Isa needs = Isa::kScalar;
};

// The kernel that variant `isa` runs for `format` with `act`:
//   kFp32 and kBf16: scalar -> *_scalar; avx2 -> *_avx2; avx512 and avx512_bf16 -> bf16_avx512 /
//     f32_avx512 for dense weights, q4_avx2 for 4-bit ones; except kBf16 with bf16 weights on
//     avx512_bf16 -> bf16_dpbf16.
//   kQ8: q8_scalar on scalar, q8_avx2 on avx2, q8_avx512_vnni on avx512 and avx512_bf16 when the
//     CPU reports AVX512_VNNI (cpu_has_avx512_vnni), else q8_avx2; throws std::invalid_argument
//     for a dense format.
//   kFp8 weights: fp8_scalar on scalar, fp8_avx2 on avx2, fp8_avx512 on avx512 and
//     avx512_bf16, with kFp32 or kBf16 activations (the latter bf16-rounded vectors), except
//     kBf16 on avx512_bf16 when the CPU reports AVX512_VBMI -> fp8_dpbf16; kNvfp4: nvfp4_scalar
//     on scalar, nvfp4_avx2 on every other variant, kFp32 activations only. Other activations
//     throw std::invalid_argument.
const RowsKernel& rows_kernel_for(Isa isa, WeightFormat format, Activations act);

// Every kernel, in id order.
const std::vector<RowsKernel>& all_rows_kernels();

// Per-process count of moe_forward calls that ran each kernel (index = RowsKernel::id).
void note_kernel_use(const RowsKernel& kernel);
std::vector<uint64_t> kernel_use_counts();

}  // namespace freetoken
