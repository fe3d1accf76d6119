"""Build the wheel and sdist of some or all packages into ``dist/``.

Usage (from the repository root)::

    hatch run release:build fs            # packages/tiering-fs only
    hatch run release:build core s3       # several
    hatch run release:build               # every package

Each package is built with ``python -m build --outdir dist packages/tiering-<x>``.
Older artifacts of the same package are removed from ``dist/`` first, so that
``scripts/check_dist.py`` never reads a stale wheel.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from _release import REPO_ROOT, Package, ReleaseError, load_packages, resolve_package
from packaging.utils import canonicalize_name


def artifact_dist_name(filename: str) -> str:
    """The canonical distribution name of a wheel or sdist file name.

    Args:
        filename: e.g. ``tiering_fs-0.1.0-py3-none-any.whl`` or ``tiering_fs-0.1.0.tar.gz``.

    Returns:
        e.g. ``tiering-fs``.
    """
    return canonicalize_name(filename.split("-", 1)[0])


def clear_old(outdir: Path, package: Package) -> None:
    """Remove the wheels and sdists of ``package`` from ``outdir``."""
    for path in [*outdir.glob("*.whl"), *outdir.glob("*.tar.gz")]:
        if artifact_dist_name(path.name) == package.dist:
            path.unlink()


def build(repo: Path, names: list[str], outdir: Path) -> list[Package]:
    """Build the given packages (all when ``names`` is empty).

    Args:
        repo: Repository root.
        names: Package names as accepted by :func:`_release.resolve_package`.
        outdir: Output directory (created when missing).

    Returns:
        The packages built.

    Raises:
        ReleaseError: On an unknown package or a failed build.
    """
    packages = load_packages(repo)
    chosen = [resolve_package(n, packages) for n in names] if names else list(packages.values())
    outdir.mkdir(parents=True, exist_ok=True)
    for package in chosen:
        clear_old(outdir, package)
        print(f"::: building {package.dist} {package.version}", flush=True)
        cmd = [sys.executable, "-m", "build", "--outdir", str(outdir), str(package.path)]
        if subprocess.run(cmd, cwd=repo, check=False).returncode != 0:
            raise ReleaseError(f"building {package.dist} failed: {' '.join(cmd)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 2 on an unknown package, 1 on a failed build.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", help="fs, tiering-fs or packages/tiering-fs (default: all)")
    parser.add_argument("--repo", type=Path, default=None, help="repository root (default: this script's repo)")
    parser.add_argument("--outdir", type=Path, default=None, help="output directory (default: <repo>/dist)")
    args = parser.parse_args(argv)
    repo = (args.repo or REPO_ROOT).resolve()
    try:
        built = build(repo, args.packages, (args.outdir or repo / "dist").resolve())
    except ReleaseError as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 1 if str(exc).startswith("building ") else 2
    print("::: built " + ", ".join(f"{p.dist} {p.version}" for p in built))
    return 0


if __name__ == "__main__":
    sys.exit(main())
