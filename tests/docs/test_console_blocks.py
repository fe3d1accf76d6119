"""Every ``console`` block of README.md and docs/content/*.md, run as a new user would copy it.

The blocks run, in page order, in one scratch folder laid out as a clone
(``packages/`` and ``scripts/`` link to this checkout), with a ``PATH`` that
holds no virtual environment: a bare ``tiering``, ``pytest`` or ``pip``
fails as it does for a user who did not activate one. The venv is made
once per session as the README's quick start makes it (``python3 -m venv
.venv`` and one ``.venv/bin/pip install`` of every ``./packages/...``
target any block names, extras merged), so each block's own ``python3 -m
venv .venv`` and ``.venv/bin/pip install ./packages/...`` are checked
against that install instead of being repeated; a command already run in
the session is not run again.

A block that cannot run here says why in the line right above it:

- ``<!-- console: skip REASON -->``: not run (the reason is the skip message);
- ``<!-- console: env NAME -->``: needs the hatch environment ``NAME`` (vLLM,
  a server); it runs only inside that environment (``hatch run NAME:test``
  runs this file), where ``hatch run NAME:CMD`` runs ``CMD`` with that
  environment's interpreter from the repository root.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs" / "content").glob("*.md"))]
BLOCK = re.compile(r"(?:^<!-- console: (skip|env) (.+?) -->\n)?^```console\n(.*?)^```", re.S | re.M)
PIP_INSTALL = ".venv/bin/pip install "
PACKAGE = re.compile(r"^\./packages/(tiering-[a-z]+)(?:\[([a-z,]+)\])?$")


def console_blocks():
    """``(page, marker, argument, commands)`` of every console block, in page order."""
    for page in PAGES:
        for marker, argument, body in BLOCK.findall(page.read_text()):
            commands = [line.strip() for line in body.splitlines() if line.strip() and not line.startswith("#")]
            yield page, marker, argument, commands


def block_id(page, commands):
    return f"{page.relative_to(REPO)}: {' / '.join(commands)[:70]}"


def pip_targets(command):
    """``{distribution: extras}`` of a ``.venv/bin/pip install ./packages/...`` command (anything else: an error)."""
    found = {}
    for word in shlex.split(command.removeprefix(PIP_INSTALL)):
        match = PACKAGE.match(word)
        assert match, f"{command!r}: {word!r} is not a ./packages/<distribution> of this repository"
        assert (REPO / "packages" / match.group(1)).is_dir(), word
        found[match.group(1)] = set(filter(None, (match.group(2) or "").split(",")))
    return found


def split_commands(line):
    return [part.strip() for part in line.split("&&")]


def all_pip_targets():
    """Every ``./packages/...`` target of every block, extras merged per distribution."""
    merged = {}
    for _, marker, _, commands in console_blocks():
        for line in commands:
            for command in split_commands(line):
                if marker != "skip" and command.startswith(PIP_INSTALL):
                    for dist, extras in pip_targets(command).items():
                        merged.setdefault(dist, set()).update(extras)
    return merged


def user_env():
    """The environment of a user's shell: no venv on PATH, nothing of this test session's Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venvs = {str(Path(sys.executable).parent), str(Path(sys.prefix) / "bin")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p not in venvs)
    return env


@pytest.fixture(scope="session")
def clone(tmp_path_factory):
    """A folder laid out as a clone, with ``.venv`` made as the quick start makes it; ``(folder, installed, ran)``."""
    folder = tmp_path_factory.mktemp("clone")
    for name in ("packages", "scripts"):
        (folder / name).symlink_to(REPO / name)
    installed = all_pip_targets()
    targets = [f"./packages/{d}[{','.join(sorted(e))}]" if e else f"./packages/{d}" for d, e in installed.items()]
    for command in (
        "python3 -m venv .venv",
        f"{PIP_INSTALL}-q {' '.join(shlex.quote(t) for t in sorted(targets))}",
    ):
        proc = subprocess.run(command, shell=True, cwd=folder, env=user_env(), capture_output=True, text=True)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return folder, installed, set()


def hatch_env():
    """The hatch environment this session runs in (``HATCH_ENV_ACTIVE``, e.g. ``vllm-cpu``), None outside hatch."""
    return os.environ.get("HATCH_ENV_ACTIVE")


def run_in_env(name, commands):
    """Run a block's ``hatch run NAME:CMD`` commands as ``CMD`` here, with this environment's interpreter."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    prefix = re.compile(rf"^(\.venv-hatch/bin/)?hatch run {re.escape(name)}:")
    for line in commands:
        for command in split_commands(line):
            assert prefix.match(command), f"{command!r} does not run in the hatch environment {name!r}"
            proc = subprocess.run(
                prefix.sub("", command), shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=900
            )
            assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"


@pytest.mark.parametrize(
    ("page", "marker", "argument", "commands"),
    [pytest.param(*b, id=block_id(b[0], b[3])) for b in console_blocks()],
)
def test_console_block_runs_as_written(page, marker, argument, commands, request):
    if marker == "skip":
        pytest.skip(argument)
    if marker == "env":
        active = hatch_env() or ""
        if active.split(".")[0] != argument:
            pytest.skip(f"needs the hatch environment {argument!r} (hatch run {argument}:test runs it)")
        run_in_env(argument, commands)
        return
    if hatch_env() not in (None, "default"):
        pytest.skip("blocks without a marker run in the default environment (hatch run docs-release)")
    folder, installed, ran = request.getfixturevalue("clone")
    for line in commands:
        for command in split_commands(line):
            if command == "python3 -m venv .venv":
                assert (folder / ".venv" / "bin" / "python").exists()
                continue
            if command.startswith(PIP_INSTALL):
                for dist, extras in pip_targets(command).items():
                    assert extras <= installed.get(dist, set()), f"{command!r}: {dist} not installed as the test did"
                continue
            if command in ran:
                continue
            proc = subprocess.run(
                command, shell=True, cwd=folder, env=user_env(), capture_output=True, text=True, timeout=600
            )
            assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
            ran.add(command)


def test_every_block_uses_the_from_a_clone_commands():
    """No bare ``tiering`` / ``pytest`` / ``pip``: copied literally, those fail until the packages are published."""
    bare = re.compile(r"(?:^|&&\s*|=\S*\s)(tiering|pytest|pip|python)\s")
    offenders = [
        f"{page.relative_to(REPO)}: {line}"
        for page, marker, _, commands in console_blocks()
        if marker != "env"
        for line in commands
        if bare.search(line)
    ]
    assert not offenders, "\n".join(offenders)
