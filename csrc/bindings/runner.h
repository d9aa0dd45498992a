// The process-wide kernel runner and the helpers every binding file shares (bind_moe.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "freetoken/isa.h"
#include "freetoken/moe.h"
#include "freetoken/thread_pool.h"

namespace freetoken::bindings {

namespace py = pybind11;

// One runner per process, created on first use (FREETOKEN_CPU_MOE_THREADS workers, default the
// physical cores; ValueError for a bad value).
MoeRunner& runner();

// The ISA variant for an `isa=` argument, else FREETOKEN_CPU_MOE_ISA, else the best one;
// ValueError for an unknown or unsupported name.
Isa resolve_isa(const std::optional<std::string>& requested);

// A torch fp32 tensor [rows, cols], filled by work(its data, the pool) on the runner (queued
// behind earlier submissions, the GIL released while it waits); a std::invalid_argument thrown
// by the work becomes a Python ValueError.
py::object run_on_pool(int64_t rows, int64_t cols, std::function<void(float*, ThreadPool&)> work);

}  // namespace freetoken::bindings
