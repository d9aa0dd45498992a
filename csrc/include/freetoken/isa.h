// Instruction-set variants of the CPU expert kernel, weight formats, and their runtime selection.
//
// Each variant lives in its own translation units (src/rows_*_<isa>.cpp) compiled with its own
// -m flags, so the module imports on any x86-64 CPU and only calls a variant the CPU reports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace freetoken {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512Bf16 = 2 };

// How an expert bank stores its weights (see csrc/README.md "Weight formats").
//   kBf16, kFp32: dense values, row-major [rows, k].
//   kMxfp4: gpt-oss MXFP4: per row k/2 bytes of e2m1 codes (low nibble = even column) and k/32
//           E8M0 scale bytes (value 2^(s-127)); group = 32.
//   kQ4g: int4 codes q in [0, 15] packed like kMxfp4, one fp16 scale per `group` columns and
//         either a uint8 zero point z per group or, symmetric, z = 8: w = (q - z) * scale.
enum class WeightFormat : int { kBf16 = 0, kFp32 = 1, kMxfp4 = 2, kQ4g = 3 };

// Short stable names used by the Python API and the FREETOKEN_CPU_MOE_ISA override.
const char* isa_name(Isa isa);

// Parses "scalar" / "avx2" / "avx512_bf16"; throws std::invalid_argument otherwise.
Isa parse_isa(const std::string& name);

// Variants this CPU and OS can run, best last (scalar is always first).
std::vector<Isa> supported_isas();

// The best supported variant.
Isa best_isa();

// Order in which a variant reads the k values of its fp32 vectors (the weights keep their stored
// order). A variant whose weight decode naturally yields columns in another order asks for the
// vectors in that order, so the permutation is paid once per vector, not once per weight row.
//   kNatural:   column order.
//   kEvenOdd16: within each full block of 16 columns, the 8 even columns then the 8 odd ones:
//               0 2 .. 14 1 3 .. 15 (AVX2 bf16 decode).
//   kNibble16:  within each full block of 16 columns: 0 4 8 12 1 5 9 13 2 6 10 14 3 7 11 15
//               (AVX2 4-bit decode, rows_q4_avx2.cpp).
// A trailing partial block stays in column order. Blocks start at column 0, so a segment
// [j0, j1) with j0 a multiple of 16 (and j1 = k or a multiple of 16) can be packed on its own.
enum class VecLayout : int { kNatural = 0, kEvenOdd16 = 1, kNibble16 = 2 };

// The layout rows_dot_for(isa, format) expects its vectors in.
VecLayout vec_layout_for(Isa isa, WeightFormat format);

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
// row r starts at element r * k (dense) or byte r * k / 2 (4-bit; k is a multiple of `group`).
// The vectors are given in the variant's layout (vec_layout_for; the sum is the same dot product,
// only the order in which its terms are added differs). The AVX-512-BF16 bf16 variant rounds the
// vectors to bf16 before the products; every other variant keeps fp32 vectors and fp32 sums.
struct RowsDotArgs {
  WeightFormat format = WeightFormat::kBf16;
  const void* w = nullptr;          // bf16 bits / fp32 values / packed 4-bit codes of row 0
  const void* scales = nullptr;     // 4-bit: [rows, k / group] uint8 E8M0 (mxfp4) or fp16 bits
  const uint8_t* zeros = nullptr;   // q4g: [rows, k / group] zero points, or nullptr (z = 8)
  int64_t group = 0;                // 4-bit group size along k (32 for mxfp4; 32 * m for q4g)
  int64_t k = 0;                    // reduction length (columns)
  int64_t row_begin = 0;
  int64_t row_end = 0;
  const float* const* vecs = nullptr;  // num_vecs pointers to k fp32 values each (VecLayout)
  const Q8Vec* qvecs = nullptr;        // q8 primitives (rows_dot_q8_for) only: num_vecs vectors
  int64_t num_vecs = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
};

using RowsDotFn = void (*)(const RowsDotArgs&);

void rows_dot_bf16_scalar(const RowsDotArgs& a);
void rows_dot_f32_scalar(const RowsDotArgs& a);
void rows_dot_q4_scalar(const RowsDotArgs& a);   // kMxfp4 and kQ4g
void rows_dot_bf16_avx2(const RowsDotArgs& a);
void rows_dot_f32_avx2(const RowsDotArgs& a);
void rows_dot_q4_avx2(const RowsDotArgs& a);     // kMxfp4 and kQ4g
void rows_dot_bf16_avx512(const RowsDotArgs& a);

// q8 activations (4-bit formats only; freetoken/q8.h): per 32-column block b of a row, the exact
// int32 sum of w_int * q over the block, then out += (float)isum * (d_b * w_scale), where the
// weight is w_int * w_scale (mxfp4: 2 * e2m1 and 2^(s - 128); q4g: c - z and the fp16 scale).
void rows_dot_q8_scalar(const RowsDotArgs& a);   // kMxfp4 and kQ4g, Q8Layout::kNatural
void rows_dot_q8_avx2(const RowsDotArgs& a);     // kMxfp4 and kQ4g, Q8Layout::kPair64

// The implementation of `isa` for `format`. The avx512_bf16 variant has its own code for bf16
// weights only; for fp32 and 4-bit weights it runs the AVX2 code (a subset of its ISA).
RowsDotFn rows_dot_for(Isa isa, WeightFormat format);

// The q8 implementation of `isa` for a 4-bit `format` (reads RowsDotArgs::qvecs, not vecs); the
// avx512_bf16 variant runs the AVX2 code. Throws std::invalid_argument for a dense format.
RowsDotFn rows_dot_q8_for(Isa isa, WeightFormat format);

}  // namespace freetoken
