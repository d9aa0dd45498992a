"""The installer's bookkeeping (no network): stamps make it idempotent per version, a failed or
half-done install is redone from scratch, unknown clients are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import install


def test_stamp_skips_finished_work_and_redoes_on_version_change(tmp_path: Path) -> None:
    calls: list[Path] = []

    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "bin").mkdir()

    target = tmp_path / "tool-1.0"
    install._stamped(target, "tool@1.0", build, force=False)
    install._stamped(target, "tool@1.0", build, force=False)
    assert calls == [target] and (target / "bin").is_dir()
    install._stamped(target, "tool@1.1", build, force=False)
    install._stamped(target, "tool@1.1", build, force=True)
    assert calls == [target] * 3


def test_failed_build_leaves_no_stamp_and_is_redone_from_scratch(tmp_path: Path) -> None:
    target = tmp_path / "tool-1.0"

    def broken(folder: Path) -> None:
        (folder / "partial").write_text("x")
        raise install.InstallError("npm exploded")

    with pytest.raises(install.InstallError, match="npm exploded"):
        install._stamped(target, "tool@1.0", broken, force=False)
    assert not (target / install.STAMP).exists()
    seen: list[list[str]] = []
    install._stamped(target, "tool@1.0", lambda folder: seen.append(sorted(p.name for p in folder.iterdir())),
                     force=False)
    assert seen == [[]] and (target / install.STAMP).is_file()


def test_run_reports_the_failing_command_and_its_output() -> None:
    with pytest.raises(install.InstallError, match=r"exit 3: sh -c echo boom; exit 3\nboom"):
        install._run(["sh", "-c", "echo boom; exit 3"])
    with pytest.raises(install.InstallError, match="cannot run 'no-such-tool-xyz'"):
        install._run(["no-such-tool-xyz"])


def test_unknown_client_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="unknown client 'vim'; expected one of claude-code, opencode"):
        install.install("vim", tmp_path)
    with pytest.raises(SystemExit):
        install.main(["--root", str(tmp_path), "vim"])
    assert "unknown client(s) vim" in capsys.readouterr().err


def test_clients_root_follows_freetoken_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FREETOKEN_CACHE", str(tmp_path))
    assert install.clients_root() == tmp_path / "clients"
    monkeypatch.delenv("FREETOKEN_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert install.clients_root() == tmp_path / "h" / ".cache" / "freetoken" / "clients"
