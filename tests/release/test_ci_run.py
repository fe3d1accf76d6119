"""Tests of .ci/run's step machinery: KEEP_GOING runs every environment of a matrix, a summary ends the run.

The step functions are cut out of .ci/run and run against a stand-in `hatch` on PATH that lists a matrix
of three environments and fails the first one; apt-get is checked to wait for the package manager's lock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI_RUN = ROOT / ".ci" / "run"

FAKE_HATCH = """#!/usr/bin/env bash
# stands in for hatch: a matrix "m" of m.a, m.b, m.c; m.a (or the whole matrix, which starts with it) fails
echo "hatch $*" >> "$CALLS"
if [ "$1 $2" = "env show" ]; then echo '{"default": {}, "m.a": {}, "m.b": {}, "m.c": {}, "mx": {}}'; exit 0; fi
case "$*" in
  *"-e m.a"*|"run m:t") exit 3 ;;
esac
exit 0
"""


def _functions() -> str:
    text = CI_RUN.read_text(encoding="utf-8")
    start = text.index("# KEEP_GOING=1 runs every step")
    end = text.index("# Integration envs")
    return text[start:end]


def _run(tmp_path: Path, keep_going: str) -> tuple[int, str, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    hatch = bin_dir / "hatch"
    hatch.write_text(FAKE_HATCH, encoding="utf-8")
    hatch.chmod(0o755)
    python = tmp_path / "root" / ".ci" / ".hatch" / "bin" / "python"  # .ci/run reads hatch's JSON with hatch's Python
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    calls = tmp_path / "calls"
    script = tmp_path / "steps.sh"
    script.write_text(
        f"set -euo pipefail\nROOT={tmp_path / 'root'}\n"
        + _functions()
        + "env_step m:t\nenv_step mx:t\n[ ${#failed[@]} -eq 0 ] || exit 1\n",
        encoding="utf-8",
    )
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CALLS": str(calls)}
    env["KEEP_GOING"] = keep_going
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)
    lines = calls.read_text(encoding="utf-8").splitlines() if calls.exists() else []
    return done.returncode, done.stdout, lines


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_keep_going_runs_every_environment_of_a_matrix_and_summarizes(tmp_path: Path) -> None:
    rc, out, calls = _run(tmp_path, "1")
    assert rc == 1
    ran = [c for c in calls if c.startswith("hatch env run")]
    assert ran == [f"hatch env run --ignore-compat -e m.{n} -- t" for n in "abc"]
    assert "hatch run mx:t" in calls  # not a matrix: run as it is
    summary = out[out.index("::: summary") :].splitlines()[1:]
    assert [line.split()[1] for line in summary] == ["FAILED", "ok", "ok", "ok"]
    assert "m.a" in summary[0]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_without_keep_going_the_first_failure_stops_the_run_with_a_summary(tmp_path: Path) -> None:
    rc, out, calls = _run(tmp_path, "0")
    assert rc == 1
    assert calls == ["hatch run m:t"]
    summary = out[out.index("::: summary") :].splitlines()[1:]
    assert len(summary) == 1
    assert summary[0].split()[1] == "FAILED"


def test_apt_get_waits_for_the_package_managers_lock() -> None:
    text = CI_RUN.read_text(encoding="utf-8")
    apt_lines = [line for line in text.splitlines() if "apt-get" in line and not line.lstrip().startswith("#")]
    assert len(apt_lines) == 2
    assert all('"${apt_opts[@]}"' in line for line in apt_lines)
    assert 'apt_opts=(-o "DPkg::Lock::Timeout=$lock_wait_s")' in text
