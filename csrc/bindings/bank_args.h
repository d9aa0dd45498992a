// Boundary checks of one expert bank (gate_up or down) in any weight format, and of the
// optional per-expert biases and clamped SwiGLU (gpt-oss), for bind_moe.cpp and bind_decode.cpp.
// Header-only so no binding file adds a pybind11 translation unit of its own (build time, see
// tensor_arg.h).
#pragma once

#include <pybind11/pybind11.h>

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "freetoken/fp8.h"
#include "freetoken/moe.h"
#include "tensor_arg.h"

namespace freetoken::bindings {

// A checked bank: the kernel's view, the tensors to keep alive, and its logical [N, R, C] shape.
struct BankArg {
  WeightBank bank;
  std::vector<py::object> keep;
  std::vector<int64_t> logical;  // [N, R, C]
};

inline WeightFormat parse_format(const std::string& name) {
  if (name == "bf16") return WeightFormat::kBf16;
  if (name == "fp32") return WeightFormat::kFp32;
  if (name == "mxfp4") return WeightFormat::kMxfp4;
  if (name == "q4g") return WeightFormat::kQ4g;
  if (name == "fp8") return WeightFormat::kFp8;
  if (name == "nvfp4") return WeightFormat::kNvfp4;
  throw py::value_error("unknown expert bank format '" + name +
                        "'; expected one of: bf16, fp32, mxfp4, q4g, fp8, nvfp4");
}

// The fp8 block shape (rows, cols) of a bank set: given for fp8 banks only.
using BlockSize = std::optional<std::pair<int64_t, int64_t>>;

inline std::string block_str(const std::pair<int64_t, int64_t>& b) {
  return "(" + std::to_string(b.first) + ", " + std::to_string(b.second) + ")";
}

// fp8: (values [N, R, C] float8_e4m3fn, scales [N, ceil(R/bm), ceil(C/bn)] float32).
inline BankArg check_fp8_bank(const py::tuple& tensors, const std::string& name,
                              const char* layout, const BlockSize& block) {
  if (!block) {
    throw py::value_error("fp8 expert banks need block_size (bm, bn): the rows and columns "
                          "of one scale block (the checkpoint's weight_block_size)");
  }
  if (block->first < 1 || block->second < 1) {
    throw py::value_error("block_size must be two positive integers (bm, bn), got " +
                          block_str(*block));
  }
  const std::string values_name = name + "_values", scales_name = name + "_scales";
  TensorArg v = check_tensor(tensors[0], values_name.c_str(), layout, 3, {"float8_e4m3fn"});
  TensorArg sc = check_tensor(tensors[1], scales_name.c_str(), "[N, ceil(R/bm), ceil(C/bn)]", 3,
                              {"float32"});
  const std::vector<int64_t> want = {v.shape[0], ceil_div(v.shape[1], block->first),
                                     ceil_div(v.shape[2], block->second)};
  if (sc.shape != want) {
    throw py::value_error(scales_name + " " + shape_str(sc.shape) + " does not match " +
                          values_name + " " + shape_str(v.shape) + " with block_size " +
                          block_str(*block) + ": expected [N, ceil(R/bm), ceil(C/bn)] = " +
                          shape_str(want));
  }
  BankArg b;
  b.bank.format = WeightFormat::kFp8;
  b.bank.values = v.data;
  b.bank.scales = sc.data;
  b.bank.block_rows = block->first;
  b.bank.block_cols = block->second;
  b.keep = {v.obj, sc.obj};
  b.logical = v.shape;
  return b;
}

// nvfp4: (packed [N, R, C/2] uint8, scales [N, R, C/16] float8_e4m3fn, global [N, R] float32).
inline BankArg check_nvfp4_bank(const py::tuple& tensors, const std::string& name) {
  const std::string packed_name = name + "_packed", scales_name = name + "_scales";
  const std::string global_name = name + "_global";
  TensorArg pk = check_tensor(tensors[0], packed_name.c_str(), "[N, R, C/2]", 3, {"uint8"});
  TensorArg sc = check_tensor(tensors[1], scales_name.c_str(), "[N, R, C/16]", 3,
                              {"float8_e4m3fn"});
  TensorArg gl = check_tensor(tensors[2], global_name.c_str(), "[N, R]", 2, {"float32"});
  const int64_t n = pk.shape[0], rows = pk.shape[1], cols = pk.shape[2] * 2;
  if (cols % 16 != 0) {
    throw py::value_error(packed_name + " " + shape_str(pk.shape) + " holds C = " +
                          std::to_string(cols) + " columns, which is not a multiple of 16 "
                          "(the NVFP4 scale group)");
  }
  if (sc.shape != std::vector<int64_t>{n, rows, cols / 16}) {
    throw py::value_error(scales_name + " " + shape_str(sc.shape) + " does not match " +
                          packed_name + " " + shape_str(pk.shape) + ": expected [N, R, C/16] = " +
                          shape_str({n, rows, cols / 16}));
  }
  if (gl.shape != std::vector<int64_t>{n, rows}) {
    throw py::value_error(global_name + " " + shape_str(gl.shape) + " does not match " +
                          packed_name + " " + shape_str(pk.shape) + ": expected [N, R] = " +
                          shape_str({n, rows}));
  }
  BankArg b;
  b.bank.format = WeightFormat::kNvfp4;
  b.bank.values = pk.data;
  b.bank.scales = sc.data;
  b.bank.row_scales = static_cast<const float*>(gl.data);
  b.bank.group = 16;
  b.keep = {pk.obj, sc.obj, gl.obj};
  b.logical = {n, rows, cols};
  return b;
}

// Checks the tensors of bank `name` ("gate_up" [N, 2I, H] or "down" [N, H, I]) stored in `format`:
//   bf16 / fp32: (values [N, R, C] bfloat16 / float32,)
//   mxfp4:       (blocks [N, R, C/32, 16] uint8, scales [N, R, C/32] uint8)
//   q4g:         (packed [N, R, C/2] uint8, scales [N, R, C/G] float16[, zeros [N, R, C/G] uint8])
//   fp8:         (values [N, R, C] float8_e4m3fn, scales [N, ceil(R/bm), ceil(C/bn)] float32),
//                with block_size (bm, bn); block_size must be empty for every other format
//   nvfp4:       (packed [N, R, C/2] uint8, scales [N, R, C/16] float8_e4m3fn,
//                global [N, R] float32)
// Raises TypeError / ValueError (messages start with the tensor's name).
inline BankArg check_bank(const std::string& format_name, const py::tuple& tensors,
                          const std::string& name, const char* layout,
                          const BlockSize& block = std::nullopt) {
  const WeightFormat format = parse_format(format_name);
  const size_t count = tensors.size();
  const bool dense = format == WeightFormat::kBf16 || format == WeightFormat::kFp32;
  const size_t lo = dense ? 1 : format == WeightFormat::kNvfp4 ? 3 : 2;
  const size_t hi = format == WeightFormat::kQ4g ? 3 : lo;
  if (count < lo || count > hi) {
    const char* expected = dense                           ? "(values,)"
                           : format == WeightFormat::kMxfp4 ? "(blocks, scales)"
                           : format == WeightFormat::kFp8   ? "(values, scales)"
                           : format == WeightFormat::kNvfp4 ? "(packed, scales, global)"
                               : "(packed, scales) or (packed, scales, zeros)";
    throw py::value_error(format_name + " " + name + " takes " + expected + ", got " +
                          std::to_string(count) + " tensors");
  }
  if (block && format != WeightFormat::kFp8) {
    throw py::value_error("block_size " + block_str(*block) + " applies to fp8 banks only, got "
                          "format " + format_name);
  }
  if (format == WeightFormat::kFp8) return check_fp8_bank(tensors, name, layout, block);
  if (format == WeightFormat::kNvfp4) return check_nvfp4_bank(tensors, name);
  BankArg b;
  b.bank.format = format;
  if (dense) {
    const std::string dt = format == WeightFormat::kBf16 ? "bfloat16" : "float32";
    TensorArg v = check_tensor(tensors[0], name.c_str(), layout, 3, {dt});
    b.bank.values = v.data;
    b.keep = {v.obj};
    b.logical = v.shape;
    return b;
  }
  const std::string codes_name = name + (format == WeightFormat::kMxfp4 ? "_blocks" : "_packed");
  const std::string scales_name = name + "_scales";
  if (format == WeightFormat::kMxfp4) {
    TensorArg blk = check_tensor(tensors[0], codes_name.c_str(), "[N, R, C/32, 16]", 4, {"uint8"});
    TensorArg sc = check_tensor(tensors[1], scales_name.c_str(), "[N, R, C/32]", 3, {"uint8"});
    if (blk.shape[3] != 16) {
      throw py::value_error(codes_name + " " + shape_str(blk.shape) +
                            " must hold 16 bytes (32 FP4 values) per block in its last dimension");
    }
    const std::vector<int64_t> want(blk.shape.begin(), blk.shape.begin() + 3);
    if (sc.shape != want) {
      throw py::value_error(scales_name + " " + shape_str(sc.shape) + " does not match " +
                            codes_name + " " + shape_str(blk.shape) + ": expected " +
                            shape_str(want));
    }
    b.bank.values = blk.data;
    b.bank.scales = sc.data;
    b.bank.group = 32;
    b.keep = {blk.obj, sc.obj};
    b.logical = {blk.shape[0], blk.shape[1], blk.shape[2] * 32};
    return b;
  }
  TensorArg pk = check_tensor(tensors[0], codes_name.c_str(), "[N, R, C/2]", 3, {"uint8"});
  TensorArg sc = check_tensor(tensors[1], scales_name.c_str(), "[N, R, C/G]", 3, {"float16"});
  const int64_t cols = pk.shape[2] * 2, groups = sc.shape[2];
  if (sc.shape[0] != pk.shape[0] || sc.shape[1] != pk.shape[1] || groups < 1 ||
      cols % groups != 0 || (cols / groups) % 32 != 0) {
    throw py::value_error(scales_name + " " + shape_str(sc.shape) + " does not match " +
                          codes_name + " " + shape_str(pk.shape) + ": expected [" +
                          std::to_string(pk.shape[0]) + ", " + std::to_string(pk.shape[1]) +
                          ", C/G] with C = " + std::to_string(cols) +
                          " and a group size G that is a multiple of 32");
  }
  b.bank.values = pk.data;
  b.bank.scales = sc.data;
  b.bank.group = cols / groups;
  b.keep = {pk.obj, sc.obj};
  if (count == 3 && !tensors[2].is_none()) {
    const std::string zeros_name = name + "_zeros";
    TensorArg zp = check_tensor(tensors[2], zeros_name.c_str(), "[N, R, C/G]", 3, {"uint8"});
    if (zp.shape != sc.shape) {
      throw py::value_error(zeros_name + " " + shape_str(zp.shape) + " does not match " +
                            scales_name + " " + shape_str(sc.shape));
    }
    b.bank.zeros = static_cast<const uint8_t*>(zp.data);
    b.keep.push_back(zp.obj);
  }
  b.logical = {pk.shape[0], pk.shape[1], cols};
  return b;
}

// "fp32", "q8" (4-bit banks only) or "bf16" (bf16 and fp8 banks only); ValueError otherwise.
inline Activations parse_activations(const std::string& activations, WeightFormat format,
                              const std::string& format_name) {
  if (activations == "fp32") return Activations::kFp32;
  if (format == WeightFormat::kFp8 && activations == "q8") {
    throw py::value_error("activations='q8' is not supported with fp8 expert banks (they take "
                          "activations='fp32' or 'bf16')");
  }
  if (format == WeightFormat::kNvfp4 && (activations == "q8" || activations == "bf16")) {
    throw py::value_error("activations='" + activations + "' is not supported with " +
                          format_name + " expert banks (they take activations='fp32')");
  }
  if (activations == "q8") {
    if (format != WeightFormat::kMxfp4 && format != WeightFormat::kQ4g) {
      throw py::value_error("activations='q8' needs 4-bit expert banks (mxfp4 or q4g), got " +
                            format_name);
    }
    return Activations::kQ8;
  }
  if (activations == "bf16") {
    if (format != WeightFormat::kBf16 && format != WeightFormat::kFp8) {
      throw py::value_error("activations='bf16' needs bf16 or fp8 expert banks, got " +
                            format_name);
    }
    return Activations::kBf16;
  }
  throw py::value_error("unknown activations '" + activations +
                        "'; expected one of: fp32, q8, bf16");
}

// Checks the optional bias `name` of the banks: None, or a contiguous CPU float32 tensor
// `layout` = [rows, cols] with the sizes the banks give (e.g. gate_up_bias [N, 2I]). Returns
// its data (nullptr for None) and appends the tensor to `keep` so it outlives the kernel's
// reads. Raises TypeError (not a tensor, not float32) / ValueError (device, rank, contiguity,
// shape); messages start with `name`.
inline const float* check_bias(const py::handle& obj, const std::string& name,
                               const char* layout, int64_t rows, int64_t cols,
                               std::vector<py::object>& keep) {
  if (obj.is_none()) return nullptr;
  TensorArg b = check_tensor(obj, name.c_str(), layout, 2, {"float32"});
  if (b.shape != std::vector<int64_t>{rows, cols}) {
    throw py::value_error(name + " " + shape_str(b.shape) +
                          " does not match the expert banks: expected " + layout + " = " +
                          shape_str({rows, cols}));
  }
  keep.push_back(b.obj);
  return static_cast<const float*>(b.data);
}

// The gpt-oss expert options of one expert problem, as passed from Python (checked in apply_glu).
struct GluArgs {
  py::object gate_up_bias;           // None or [N, 2I] float32
  py::object down_bias;              // None or [N, H] float32
  std::optional<double> swiglu_limit;  // None: silu(g) * u
  double swiglu_alpha = 1.702;
};

// Checks `glu` against banks of N experts, H hidden, I intermediate and sets p's gpt-oss fields;
// the bias tensors join `keep`. Raises TypeError / ValueError (messages name the argument).
inline void apply_glu(const GluArgs& glu, int64_t n, int64_t h, int64_t i, MoeProblem& p,
                      std::vector<py::object>& keep) {
  p.gate_up_bias = check_bias(glu.gate_up_bias, "gate_up_bias", "[N, 2I]", n, 2 * i, keep);
  p.down_bias = check_bias(glu.down_bias, "down_bias", "[N, H]", n, h, keep);
  const auto repr = [](double v) { return py::repr(py::float_(v)).cast<std::string>(); };
  if (!std::isfinite(glu.swiglu_alpha)) {
    throw py::value_error("swiglu_alpha must be finite, got " + repr(glu.swiglu_alpha));
  }
  if (!glu.swiglu_limit) {
    // alpha only exists in the gpt-oss activation: a changed alpha without it would be ignored.
    if (glu.swiglu_alpha != 1.702) {
      throw py::value_error("swiglu_alpha applies only with swiglu_limit (the gpt-oss "
                            "activation); got swiglu_alpha=" + repr(glu.swiglu_alpha) +
                            " with swiglu_limit=None");
    }
    return;
  }
  // Checked as the float the kernel gets: a positive double below the float range is 0 there.
  if (!(static_cast<float>(*glu.swiglu_limit) > 0.0f)) {
    throw py::value_error("swiglu_limit must be > 0 (inf: the gpt-oss activation without a "
                          "clamp; None: silu(g) * u), got " + repr(*glu.swiglu_limit));
  }
  p.swiglu_clamp = true;
  p.swiglu_limit = static_cast<float>(*glu.swiglu_limit);
  p.swiglu_alpha = static_cast<float>(glu.swiglu_alpha);
}

}  // namespace freetoken::bindings
