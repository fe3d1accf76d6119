"""Run each backend's tests against the oldest and the newest tiering-core it admits.

Usage (from the repository root)::

    hatch run release:compat                 # every backend
    python scripts/compat.py fs s3 --pytest-args="-q -x"

For each backend the oldest admitted core is the lowest version among the
released cores (git tags ``tiering-core-v<version>``) and the current tree's core
that the backend's ``tiering-core`` range admits. A tagged version is built from
the tag (``git archive``); the current version from the work tree. The newest is
the current tree's core. When both are the same build the tests run once.

While tiering-core has a single version (no release tag of another core
version), the oldest and the newest admitted core are the same build and the
run would only repeat the unit tests: the script says so in one line and
exits 0 (``--force`` runs anyway).

Logs go to ``.ci/state/compat-logs`` (``--logs DIR``), never the system
temporary directory.

Each run gets a fresh ``python3.11 -m venv`` with pip, installs the core wheel, the
backend wheel (built from the current tree, with its ``test`` extra when it has
one) and pytest, then runs ``pytest packages/tiering-<x>/tests`` from the
repository root. A table of the results is printed at the end; the exit status
is 1 when any run failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _release import (
    CORE,
    REPO_ROOT,
    Package,
    ReleaseError,
    admits,
    core_tags,
    core_version,
    load_packages,
    resolve_package,
    tomllib,
)
from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclasses.dataclass
class CoreChoice:
    """A tiering-core version to test against and where it comes from.

    Attributes:
        version: The core version.
        tag: The git tag it is built from, or None for the current work tree.
    """

    version: Version
    tag: str | None

    @property
    def source(self) -> str:
        """Human-readable origin of the build."""
        return f"tag {self.tag}" if self.tag else "current tree"


@dataclasses.dataclass
class Row:
    """One line of the result table."""

    backend: str
    bound: str
    spec: str
    core: str
    source: str
    result: str
    seconds: float
    ok: bool


def choose_cores(spec: SpecifierSet, current: Version, tags: dict[Version, str]) -> tuple[CoreChoice | None, ...]:
    """Pick the oldest and the newest tiering-core a backend's range admits.

    Args:
        spec: The backend's ``tiering-core`` specifier.
        current: The work tree's core version.
        tags: Released core versions (version to tag name).

    Returns:
        ``(oldest, newest)``; ``newest`` is the current tree (None when the range
        excludes it), ``oldest`` the lowest admitted released or current version
        (None when nothing is admitted).
    """
    candidates = {v: tag for v, tag in tags.items() if v != current}
    candidates[current] = None
    admitted = sorted(v for v in candidates if admits(spec, v))
    oldest = CoreChoice(admitted[0], candidates[admitted[0]]) if admitted else None
    newest = CoreChoice(current, None) if admits(spec, current) else None
    return oldest, newest


def _run(cmd: list[str], cwd: Path, log: Path) -> bool:
    """Run a command, appending its output to ``log``; return whether it succeeded."""
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"$ {shlex.join(cmd)}\n")
        fh.flush()
        return subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode == 0


def build_wheel(src: Path, outdir: Path, log: Path) -> Path:
    """Build one wheel of a package directory into ``outdir``.

    Args:
        src: The package directory (holding ``pyproject.toml``).
        outdir: Output directory; must not hold another wheel of the package.
        log: Log file for the build output.

    Returns:
        The wheel's path.
    """
    outdir.mkdir(parents=True, exist_ok=True)
    if not _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(src)], src, log):
        raise ReleaseError(f"building the wheel of {src} failed; see {log}")
    wheels = sorted(outdir.glob("*.whl"))
    if len(wheels) != 1:
        raise ReleaseError(f"expected one wheel in {outdir}, found {[w.name for w in wheels]}")
    return wheels[0]


def core_wheel(repo: Path, choice: CoreChoice, workdir: Path, log: Path) -> Path:
    """Build the tiering-core wheel of a choice (from its tag, or the work tree).

    Args:
        repo: Repository root.
        choice: The core version and origin.
        workdir: Scratch folder.
        log: Log file.

    Returns:
        The wheel's path.
    """
    out = workdir / f"wheels-core-{choice.version}"
    if out.is_dir():
        return next(out.glob("*.whl"))
    if choice.tag is None:
        return build_wheel(repo / "packages" / CORE, out, log)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", choice.tag, f"packages/{CORE}"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise ReleaseError(f"git archive {choice.tag} failed: {archive.stderr.decode(errors='replace').strip()}")
    src = workdir / f"src-core-{choice.version}"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(src, filter="data")
    return build_wheel(src / "packages" / CORE, out, log)


def run_tests(
    repo: Path,
    backend: Package,
    backend_whl: Path,
    core_whl: Path,
    expect: Version,
    venv: Path,
    python: str,
    pytest_args: list[str],
    log: Path,
) -> tuple[bool, str]:
    """Create a venv with one core wheel and one backend wheel, then run the backend's tests.

    Args:
        repo: Repository root (pytest runs there, with the root configuration).
        backend: The backend package.
        backend_whl: Its wheel.
        core_whl: The tiering-core wheel to test against.
        expect: The core version that must end up installed.
        venv: Where to create the venv.
        python: Interpreter creating the venv.
        pytest_args: Extra pytest arguments.
        log: Log file.

    Returns:
        Whether the tests passed, and pytest's summary line (or the failing step).
    """
    if not _run([python, "-m", "venv", str(venv)], repo, log):
        return False, f"venv creation with {python} failed"
    py = str(venv / "bin" / "python")
    extras = "[test]" if "test" in _optional_extras(backend) else ""
    install = [py, "-m", "pip", "install", "-q", str(core_whl), f"{backend.dist}{extras} @ {backend_whl.as_uri()}"]
    install.append("pytest")
    if not _run(install, repo, log):
        return False, "pip install failed"
    probe = subprocess.run(
        [py, "-c", f"import importlib.metadata as m; print(m.version({CORE!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.stdout.strip() != str(expect):
        return False, f"installed {CORE} is {probe.stdout.strip() or probe.stderr.strip()}, expected {expect}"
    tests = backend.path / "tests"
    cmd = [py, "-m", "pytest", str(tests.relative_to(repo)), "-p", "no:cacheprovider", *pytest_args]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, check=False)
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"$ {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}")
    lines = [ln.strip("= ") for ln in proc.stdout.splitlines() if ln.strip()]
    return proc.returncode == 0, (lines[-1] if lines else f"pytest exited {proc.returncode}")


def _optional_extras(package: Package) -> set[str]:
    """Names of the ``[project.optional-dependencies]`` of a package."""
    data = tomllib.loads((package.path / "pyproject.toml").read_text(encoding="utf-8"))
    return set(data.get("project", {}).get("optional-dependencies", {}))


def compat(repo: Path, names: list[str], workdir: Path, python: str, pytest_args: list[str]) -> list[Row]:
    """Run every chosen backend against its oldest and newest admitted core.

    Args:
        repo: Repository root.
        names: Backends to run (all when empty).
        workdir: Scratch folder for sources, wheels, venvs and logs.
        python: Interpreter creating the venvs.
        pytest_args: Extra pytest arguments.

    Returns:
        The table rows.
    """
    packages = load_packages(repo)
    current = core_version(packages)
    tags = core_tags(repo)
    backends = [resolve_package(n, packages) for n in names] if names else list(packages.values())
    backends = [b for b in backends if not b.is_core]
    rows: list[Row] = []
    for backend in backends:
        spec = backend.core_specifier
        declared = backend.core_requirement_text or "-"
        log = workdir / f"{backend.dist}.log"
        if spec is None:
            rows.append(Row(backend.dist, "-", "-", "-", "-", f"no {CORE} dependency", 0.0, False))
            continue
        oldest, newest = choose_cores(spec, current, tags)
        versions = f"oldest {oldest and oldest.version}, newest {newest and newest.version}"
        print(f"::: {backend.dist} ({CORE}{spec}): {versions}", flush=True)
        backend_whl = build_wheel(backend.path, workdir / f"wheels-{backend.dist}", log)
        done: dict[Version, tuple[bool, str]] = {}
        for bound, choice in (("oldest", oldest), ("newest", newest)):
            if choice is None:
                why = f"range excludes current {current}" if bound == "newest" else "no admitted core"
                rows.append(Row(backend.dist, bound, declared, "-", "-", why, 0.0, False))
                continue
            if choice.version in done:
                ok, result = done[choice.version]
                rows.append(Row(backend.dist, bound, declared, str(choice.version), choice.source,
                                f"same build as oldest: {result}", 0.0, ok))  # fmt: skip
                continue
            t0 = time.monotonic()
            try:
                whl = core_wheel(repo, choice, workdir, log)
                venv = workdir / f"venv-{backend.dist}-{choice.version}"
                ok, result = run_tests(repo, backend, backend_whl, whl, choice.version, venv, python, pytest_args, log)
            except ReleaseError as exc:
                ok, result = False, str(exc)
            secs = time.monotonic() - t0
            done[choice.version] = (ok, result)
            print(f"::: {backend.dist} vs {CORE} {choice.version} ({choice.source}): {result} [{secs:.0f} s]")
            rows.append(Row(backend.dist, bound, declared, str(choice.version), choice.source, result, secs, ok))
    return rows


def single_core_version(repo: Path) -> Version | None:
    """The core version when it is the only one (no release tag of another version), else None."""
    current = core_version(load_packages(repo))
    return None if any(v != current for v in core_tags(repo)) else current


def print_table(rows: list[Row]) -> None:
    """Print the result rows as an aligned table."""
    header = ("backend", "run", "declares", "core", "built from", "status", "result", "time")
    table = [header] + [
        (r.backend, r.bound, r.spec, r.core, r.source, "ok" if r.ok else "FAIL", r.result, f"{r.seconds:.0f}s")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 when every run passed, 1 otherwise, 2 on a usage error.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backends", nargs="*", help="example, fs, s3 ... (default: every backend)")
    parser.add_argument("--repo", type=Path, default=None, help="repository root (default: this script's repo)")
    parser.add_argument("--python", default="python3.11", help="interpreter for the venvs (default: python3.11)")
    parser.add_argument("--pytest-args", default="-q", help="extra pytest arguments, one string (default: -q)")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder, kept (default: temp)")
    parser.add_argument("--logs", type=Path, default=None, help="log folder (default: .ci/state/compat-logs)")
    parser.add_argument("--force", action="store_true", help="run even while tiering-core has a single version")
    args = parser.parse_args(argv)
    repo = (args.repo or REPO_ROOT).resolve()
    try:
        only = single_core_version(repo)
    except ReleaseError as exc:
        print(f"compat: {exc}", file=sys.stderr)
        return 2
    if only is not None and not args.force:
        print(
            f"compat: skipped: {CORE} {only} is the only core version (no release tag of another), so each "
            "backend's oldest and newest admitted core are this tree's and the unit runs already cover them"
        )
        return 0
    workdir = args.workdir.resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="tiering-compat-"))
    workdir.mkdir(parents=True, exist_ok=True)
    logs = (args.logs or repo / ".ci" / "state" / "compat-logs").resolve()
    t0 = time.monotonic()
    try:
        rows = compat(repo, args.backends, workdir, args.python, shlex.split(args.pytest_args))
    except ReleaseError as exc:
        print(f"compat: {exc}", file=sys.stderr)
        return 2
    finally:
        if logs != workdir:  # keep the logs; a temporary workdir goes
            shutil.rmtree(logs, ignore_errors=True)
            logs.mkdir(parents=True)
            for log in workdir.glob("*.log"):
                shutil.copy(log, logs / log.name)
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print_table(rows)
    print(f"\ncompat run took {time.monotonic() - t0:.0f} s; logs in {logs}")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
