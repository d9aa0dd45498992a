"""Builds the C++ CPU expert kernel ``freetoken.ops.cpu_moe._ext`` (run by csrc/build_backend.py).

Each ISA variant (``csrc/src/rows_<kind>_<isa>.cpp``) is compiled with its own ``-m`` flags and every
other file with none, so the module imports on any x86-64 CPU and picks a variant at runtime.
"""

from __future__ import annotations

import platform
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import setup
from setuptools.command.build_ext import build_ext

CSRC = Path("csrc")
X86 = platform.machine().lower() in {"x86_64", "amd64", "i686", "i386"}
# Per-file flags, keyed by source file stem.
ISA_FLAGS = {
    "rows_dot_avx2": ["-mavx2", "-mfma", "-mf16c"],
    "rows_q4_avx2": ["-mavx2", "-mfma", "-mf16c"],
    "rows_q8_avx2": ["-mavx2", "-mfma", "-mf16c"],
    "rows_fp8_avx2": ["-mavx2", "-mfma", "-mf16c"],
    "rows_nvfp4_avx2": ["-mavx2", "-mfma", "-mf16c"],
    "decode_avx2": ["-mavx2", "-mfma", "-mf16c"],
    "dequant_avx2": ["-mavx2", "-mfma", "-mf16c"],
    "decode_avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl"],
    "rows_dot_avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl"],
    "rows_q8_avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
                       "-mavx512vnni"],
    "rows_fp8_avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl"],
    "rows_dot_avx512_bf16": ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl",
                             "-mavx512bf16"],
    "rows_fp8_dpbf16": ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl",
                        "-mavx512bf16", "-mavx512vbmi"],
}


class BuildExt(build_ext):
    """build_ext that adds ISA flags to the files that need them."""

    def build_extensions(self) -> None:
        compile_one = self.compiler._compile

        def _compile(obj, src, ext, cc_args, extra_postargs, pp_opts):  # noqa: ANN001
            extra = list(extra_postargs) + ISA_FLAGS.get(Path(src).stem, [])
            compile_one(obj, src, ext, cc_args, extra, pp_opts)

        self.compiler._compile = _compile
        super().build_extensions()


# The pybind11 files take ~12 s each; compile files in parallel (FREETOKEN_BUILD_JOBS, default:
# all CPUs).
ParallelCompile("FREETOKEN_BUILD_JOBS").install()

sources = sorted(str(p) for p in (CSRC / "src").glob("*.cpp"))
sources += sorted(str(p) for p in (CSRC / "bindings").glob("*.cpp"))
if not X86:
    sources = [s for s in sources if Path(s).stem not in ISA_FLAGS]

ext = Pybind11Extension(
    "freetoken.ops.cpu_moe._ext",
    sources,
    include_dirs=[str(CSRC / "include")],
    cxx_std=17,
    extra_compile_args=["-O3", "-fvisibility=hidden"],
    extra_link_args=["-pthread"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
