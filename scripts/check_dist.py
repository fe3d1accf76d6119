"""Check the wheels and sdists in ``dist/`` against the source tree.

Usage (from the repository root)::

    python scripts/check_dist.py            # dist/
    python scripts/check_dist.py other-dir  # any folder of built artifacts

For each wheel it checks that

- it does not ship ``tiering/__init__.py`` (``tiering`` is a PEP 420 namespace);
- it ships the ``tiering/<x>/py.typed`` marker;
- its METADATA ``Name`` is a package of this tree and its ``Version`` equals the
  package's ``__about__.py``;
- its METADATA ``Project-URL`` entries are the package's ``[project.urls]``
  (every package declares some);
- tiering-cli ships the replay traces (:data:`SHIPPED_DATA`) with their
  Apache-2.0 licence and attribution, identical to the tree's files;
- for a tier's distribution (one whose ``pyproject.toml`` declares a ``tiering.tiers``
  entry point): ``entry_points.txt`` declares that entry point, naming a class of the
  package that the wheel ships; for every distribution but core: its METADATA
  ``Requires-Dist`` on tiering-core admits the current core version;
- the matching sdist ``<name>-<version>.tar.gz`` is there too;
- a package with a native part (:data:`NATIVE_FILES`: tiering-fs's batch block
  I/O library) ships the library and its licence in the wheel, which is then
  tagged ``py3-none-<platform>`` (not ``any``), and the C sources, the build
  hook and the licence, but no built library, in the sdist.

It prints one line per wheel and exits 1 when any check fails (2 when there is
nothing to check). ``twine check dist/*`` is run separately.
"""

from __future__ import annotations

import argparse
import configparser
import re
import sys
import tarfile
import zipfile
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

from _release import (
    CORE,
    ENTRY_POINT_GROUP,
    REPO_ROOT,
    Package,
    ReleaseError,
    admits,
    core_version,
    load_packages,
    tomllib,
)
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

TRACE_DATA = "tiering/cli/bench/data"
SHIPPED_DATA = {
    "tiering-cli": [
        f"{TRACE_DATA}/mooncake_conversation_trace.jsonl",
        f"{TRACE_DATA}/mooncake_synthetic_trace.jsonl",
        f"{TRACE_DATA}/LICENSE-APACHE-2.0",
        f"{TRACE_DATA}/README.md",
    ]
}
"""Data files a wheel must ship (path inside the wheel), by distribution."""

ATTRIBUTION = {
    f"{TRACE_DATA}/README.md": ("kvcache-ai/Mooncake", "Apache License"),
    f"{TRACE_DATA}/LICENSE-APACHE-2.0": ("Apache License",),
}
"""Texts each licence / attribution file must contain."""


NATIVE_DIR = "tiering/fs/native"
NATIVE_FILES = {
    "tiering-fs": (
        [f"{NATIVE_DIR}/libblockio.so", f"{NATIVE_DIR}/LICENSE-xxhash"],
        [
            "hatch_build.py",
            f"src/{NATIVE_DIR}/_blockio.c",
            f"src/{NATIVE_DIR}/xxhash.h",
            f"src/{NATIVE_DIR}/xxh_x86dispatch.c",
            f"src/{NATIVE_DIR}/LICENSE-xxhash",
        ],
    )
}
"""By distribution: what its wheel must ship (the native library first) and what its sdist must (build inputs)."""


def _native_problems(zf: zipfile.ZipFile, info: str, package: Package) -> list[str]:
    """The wheel of a package with a native part: library and licence shipped, a platform tag."""
    wheel_files = NATIVE_FILES.get(package.dist, ([], []))[0]
    if not wheel_files:
        return []
    names = set(zf.namelist())
    problems = [f"{n} missing (native part; built without a C compiler?)" for n in wheel_files if n not in names]
    if wheel_files[0] in names and b"tkvb_abi_version" not in zf.read(wheel_files[0]):
        problems.append(f"{wheel_files[0]} does not export tkvb_abi_version")
    tags = None
    if f"{info}/WHEEL" in names:
        tags = HeaderParser().parsestr(zf.read(f"{info}/WHEEL").decode("utf-8")).get_all("Tag")
    if not tags or any(t.endswith("-any") or not t.startswith("py3-none-") for t in tags):
        problems.append(f"WHEEL Tag {tags} is not py3-none-<platform> (the wheel ships a native library)")
    return problems


def _sdist_problems(sdist: Path, package: Package) -> list[str]:
    """The sdist of a package with a native part: its build inputs there, no built library."""
    needed = NATIVE_FILES.get(package.dist, ([], []))[1]
    if not needed:
        return []
    try:
        with tarfile.open(sdist) as tf:
            names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    except (tarfile.TarError, OSError) as exc:
        return [f"{sdist.name} is not a readable sdist: {exc}"]
    problems = [f"{sdist.name} lacks {n}" for n in needed if n not in names]
    return problems + [f"{sdist.name} ships a built library {n}" for n in sorted(names) if n.endswith(".so")]


def _data_problems(zf: zipfile.ZipFile, package: Package) -> list[str]:
    """Check the data files a wheel must ship: present, equal to the tree's copy, attribution intact."""
    names = set(zf.namelist())
    problems = []
    for name in SHIPPED_DATA.get(package.dist, []):
        if name not in names:
            problems.append(f"{name} missing (shipped data)")
            continue
        data = zf.read(name)
        source = package.path / "src" / name
        if source.is_file() and source.read_bytes() != data:
            problems.append(f"{name} differs from {source.relative_to(package.path)}")
        text = data.decode("utf-8", errors="replace")
        problems += [f"{name} lacks {needle!r}" for needle in ATTRIBUTION.get(name, ()) if needle not in text]
    return problems


def _declared_urls(package: Package) -> dict[str, str]:
    """The ``[project.urls]`` of a package's pyproject.toml."""
    data = tomllib.loads((package.path / "pyproject.toml").read_text(encoding="utf-8"))
    return dict(data.get("project", {}).get("urls", {}))


def _url_problems(meta: Message, package: Package) -> list[str]:
    """METADATA ``Project-URL`` against the package's ``[project.urls]``."""
    declared = _declared_urls(package)
    if not declared:
        return [f"{package.dist}'s pyproject.toml has no [project.urls]"]
    shipped = {}
    for line in meta.get_all("Project-URL") or []:
        label, _, url = line.partition(",")
        shipped[label.strip()] = url.strip()
    if shipped != declared:
        return [f"METADATA Project-URL {shipped} != [project.urls] {declared}"]
    return []


def _dist_info(names: list[str]) -> str | None:
    """The ``*.dist-info`` folder of a wheel's file list, if exactly one."""
    found = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    return found.pop() if len(found) == 1 else None


def _entry_point_problems(zf: zipfile.ZipFile, info: str, package: Package) -> tuple[list[str], str]:
    """Check the ``tiering.tiers`` entry points of a backend wheel.

    Args:
        zf: The open wheel.
        info: Its ``*.dist-info`` folder name.
        package: The package the wheel belongs to.

    Returns:
        The problems found and a short summary of the entry points for the report line.
    """
    names = set(zf.namelist())
    ep_file = f"{info}/entry_points.txt"
    if ep_file not in names:
        return [f"no {ep_file} (the {ENTRY_POINT_GROUP} entry point is missing)"], ""
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(zf.read(ep_file).decode("utf-8"))
    if not parser.has_section(ENTRY_POINT_GROUP) or not parser.items(ENTRY_POINT_GROUP):
        return [f"entry_points.txt has no [{ENTRY_POINT_GROUP}] entry point"], ""
    shipped = {k.strip(): v.strip() for k, v in parser.items(ENTRY_POINT_GROUP)}
    problems = []
    if package.entry_points and shipped != package.entry_points:
        problems.append(f"[{ENTRY_POINT_GROUP}] is {shipped}, pyproject.toml declares {package.entry_points}")
    module_prefix = f"tiering.{package.short.replace('-', '_')}"
    for name, value in shipped.items():
        module, _, attr = value.partition(":")
        if not attr or not (module == module_prefix or module.startswith(module_prefix + ".")):
            problems.append(f"entry point {name} = {value} does not name a class of {module_prefix} (module:Class)")
            continue
        mod_path = module.replace(".", "/")
        source_name = next((n for n in (f"{mod_path}/__init__.py", f"{mod_path}.py") if n in names), None)
        if source_name is None:
            problems.append(f"entry point {name} = {value}: module {module} is not in the wheel")
            continue
        class_name = attr.split(".")[0]
        if not re.search(rf"\b{re.escape(class_name)}\b", zf.read(source_name).decode("utf-8")):
            problems.append(f"entry point {name} = {value}: {class_name} is not defined or imported in {source_name}")
    return problems, ", ".join(f"{k} = {v}" for k, v in shipped.items())


def check_wheel(wheel: Path, packages: dict[str, Package], core: Version) -> tuple[Package | None, list[str], str]:
    """Check one wheel.

    Args:
        wheel: Path of the ``.whl`` file.
        packages: The packages of the source tree.
        core: The current tiering-core version of the tree.

    Returns:
        The package the wheel belongs to (None when unknown), the problems found,
        and a summary for the report line.
    """
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        return None, [f"not a readable wheel: {exc}"], ""
    with zf:
        names = zf.namelist()
        info = _dist_info(names)
        if info is None or f"{info}/METADATA" not in names:
            return None, ["no single *.dist-info/METADATA in the wheel"], ""
        meta = HeaderParser().parsestr(zf.read(f"{info}/METADATA").decode("utf-8"))
        dist = canonicalize_name(meta.get("Name", ""))
        package = packages.get(dist)
        if package is None:
            return None, [f"METADATA Name {meta.get('Name')!r} is not a package of this tree"], ""
        problems = []
        summary = [f"{package.dist} {meta.get('Version')}"]
        if "tiering/__init__.py" in names:
            problems.append("ships tiering/__init__.py (tiering must stay a namespace package)")
        typed = f"tiering/{package.short.replace('-', '_')}/py.typed"
        if typed not in names:
            problems.append(f"{typed} marker missing")
        try:
            version = Version(meta.get("Version", ""))
        except InvalidVersion:
            version = None
        problems += _url_problems(meta, package)
        problems += _data_problems(zf, package)
        problems += _native_problems(zf, info, package)
        if NATIVE_FILES.get(package.dist):
            summary.append("native library")
        if SHIPPED_DATA.get(package.dist):
            summary.append(f"{len(SHIPPED_DATA[package.dist])} data files")
        if version != package.version:
            problems.append(
                f"METADATA Version {meta.get('Version')} != {package.about.name} version {package.version} "
                "(stale or foreign build? rebuild with scripts/build.py)"
            )
        if package.entry_points:  # a tier's distribution (adapters and tools provide no tier)
            ep_problems, ep_summary = _entry_point_problems(zf, info, package)
            problems += ep_problems
            if ep_summary:
                summary.append(ep_summary)
        if not package.is_core:
            reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
            core_reqs = [r for r in reqs if canonicalize_name(r.name) == CORE and not r.marker]
            if not core_reqs:
                problems.append(f"METADATA has no unconditional Requires-Dist on {CORE}")
            for req in core_reqs:
                if admits(req.specifier, core):
                    summary.append(f"{CORE}{req.specifier} admits {core}")
                else:
                    problems.append(f"Requires-Dist {CORE}{req.specifier} does not admit the current {CORE} {core}")
    return package, problems, "; ".join(summary)


def sdist_for(dist_dir: Path, dist: str, version: str) -> Path | None:
    """The sdist of a distribution and version in ``dist_dir``, if present."""
    for path in dist_dir.glob("*.tar.gz"):
        stem = path.name.removesuffix(".tar.gz")
        name, _, ver = stem.rpartition("-")
        if canonicalize_name(name) == dist and ver == version:
            return path
    return None


def check_dist(dist_dir: Path, repo: Path) -> int:
    """Check every wheel of ``dist_dir`` and print one line per wheel.

    Args:
        dist_dir: Folder of built artifacts.
        repo: Repository root whose packages the artifacts must match.

    Returns:
        The exit status: 0 when all pass, 1 on any failure, 2 when there is no wheel.
    """
    packages = load_packages(repo)
    core = core_version(packages)
    wheels = sorted(dist_dir.glob("*.whl"))
    if not wheels:
        print(f"check_dist: no wheel in {dist_dir}; run scripts/build.py first", file=sys.stderr)
        return 2
    failed = 0
    for wheel in wheels:
        package, problems, summary = check_wheel(wheel, packages, core)
        sdist = None if package is None else sdist_for(dist_dir, package.dist, wheel.name.split("-")[1])
        if package is not None and sdist is None:
            problems.append(f"no sdist {wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.tar.gz next to it")
        elif package is not None and sdist is not None:
            problems += _sdist_problems(sdist, package)
        if problems:
            failed += 1
            print(f"FAIL {wheel.name}: " + "; ".join(problems))
        else:
            print(f"ok   {wheel.name}: {summary}")
    print(f"{len(wheels) - failed} of {len(wheels)} wheels passed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status (see :func:`check_dist`).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dist_dir", nargs="?", type=Path, default=None, help="folder of artifacts (default: dist)")
    parser.add_argument("--repo", type=Path, default=None, help="repository root (default: this script's repo)")
    args = parser.parse_args(argv)
    repo = (args.repo or REPO_ROOT).resolve()
    try:
        return check_dist((args.dist_dir or repo / "dist").resolve(), repo)
    except ReleaseError as exc:
        print(f"check_dist: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
