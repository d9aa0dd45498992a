"""In-tree PEP 517 build backend: setuptools, reading the extension build script from csrc/.

The repository's top level is fixed (no setup.py there), so ``pyproject.toml`` names this module
(``backend-path = ["csrc"]``) and it runs ``csrc/setup_ext.py`` wherever setuptools would run
``setup.py``. Everything else is ``setuptools.build_meta`` unchanged.
"""

from __future__ import annotations

import os

from setuptools import build_meta as _meta

SETUP_SCRIPT = os.path.join("csrc", "setup_ext.py")


class _Backend(_meta._BuildMetaBackend):
    def run_setup(self, setup_script: str = "setup.py") -> None:
        super().run_setup(setup_script=SETUP_SCRIPT)


_backend = _Backend()
get_requires_for_build_wheel = _backend.get_requires_for_build_wheel
get_requires_for_build_sdist = _backend.get_requires_for_build_sdist
get_requires_for_build_editable = _backend.get_requires_for_build_editable
prepare_metadata_for_build_wheel = _backend.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _backend.prepare_metadata_for_build_editable
build_wheel = _backend.build_wheel
build_sdist = _backend.build_sdist
build_editable = _backend.build_editable
