"""The ``freetoken`` command line itself: ``--version``."""

from __future__ import annotations

import subprocess
import sys

import pytest

import freetoken
from freetoken.cli import main


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_package_version_and_exits_0(flag: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([flag])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"freetoken {freetoken.__version__}\n"


def test_version_from_the_command_line_does_not_import_torch() -> None:
    code = ("import sys; from freetoken.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit as e:\n"
            "    print(e.code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines()[-1] == "0 False"
