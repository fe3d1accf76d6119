"""Shared helpers of the release scripts (bump, build, check_dist, compat).

Every package of the monorepo lives in ``packages/tiering-<x>`` with a
``pyproject.toml`` (hatchling, version read from the ``__about__.py`` named by
``[tool.hatch.version] path``) and a ``CHANGELOG.md``. This module reads that
layout; it never imports the packages themselves.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

CORE = "tiering-core"
"""Distribution name of the core package every backend depends on."""

ENTRY_POINT_GROUP = "tiering.tiers"
"""Entry-point group through which backends register their tier class."""

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The repository these scripts belong to (the default ``--repo``)."""

_VERSION_RE = re.compile(r"""^(__version__\s*=\s*)(['"])([^'"]+)(['"])""", re.MULTILINE)


class ReleaseError(Exception):
    """A refusal with a message meant for the user (the scripts exit 2 on it)."""


@dataclasses.dataclass(frozen=True)
class Package:
    """One distribution of the monorepo, as declared in its ``pyproject.toml``.

    Attributes:
        dist: Distribution name, e.g. ``tiering-fs``.
        short: Short name, e.g. ``fs`` (also the import name ``tiering.fs``).
        path: The package directory, ``<repo>/packages/tiering-fs``.
        about: Path of the ``__about__.py`` holding ``__version__``.
        version: The version currently written in ``about``.
        core_requirement: The parsed ``tiering-core`` requirement, if any.
        core_requirement_text: That requirement as written in ``pyproject.toml``.
        entry_points: The ``tiering.tiers`` entry points (name to ``module:attr``).
    """

    dist: str
    short: str
    path: Path
    about: Path
    version: Version
    core_requirement: Requirement | None
    core_requirement_text: str | None
    entry_points: dict[str, str]

    @property
    def changelog(self) -> Path:
        """Path of the package's ``CHANGELOG.md``."""
        return self.path / "CHANGELOG.md"

    @property
    def is_core(self) -> bool:
        """Whether this package is tiering-core itself."""
        return self.dist == CORE

    @property
    def core_specifier(self) -> SpecifierSet | None:
        """The version range this package admits for tiering-core, if it depends on it."""
        return self.core_requirement.specifier if self.core_requirement is not None else None

    @property
    def tag_prefix(self) -> str:
        """Prefix of this package's release tags, e.g. ``tiering-fs-v``."""
        return f"{self.dist}-v"


def read_version(about: Path) -> Version:
    """Read ``__version__`` from an ``__about__.py`` file.

    Args:
        about: Path of the file.

    Returns:
        The parsed version.

    Raises:
        ReleaseError: When the file has no parsable ``__version__``.
    """
    match = _VERSION_RE.search(about.read_text(encoding="utf-8"))
    if match is None:
        raise ReleaseError(f"{about}: no __version__ = '...' line found")
    try:
        return Version(match.group(3))
    except InvalidVersion as exc:
        raise ReleaseError(f"{about}: invalid version {match.group(3)!r}") from exc


def write_version(about: Path, version: Version) -> None:
    """Rewrite the ``__version__`` line of an ``__about__.py`` file, keeping the rest.

    Args:
        about: Path of the file.
        version: The new version.
    """
    text = about.read_text(encoding="utf-8")
    new_text, count = _VERSION_RE.subn(lambda m: f"{m.group(1)}{m.group(2)}{version}{m.group(4)}", text, count=1)
    if count != 1:
        raise ReleaseError(f"{about}: no __version__ = '...' line found")
    about.write_text(new_text, encoding="utf-8")


def core_requirement(dependencies: list[str], where: str) -> tuple[Requirement, str] | None:
    """Find the ``tiering-core`` requirement among PEP 508 dependency strings.

    Args:
        dependencies: The ``[project] dependencies`` list.
        where: Name used in error messages (the pyproject path).

    Returns:
        The requirement and its text as written, or None when the package does not
        depend on tiering-core.
    """
    for dep in dependencies:
        try:
            req = Requirement(dep)
        except InvalidRequirement as exc:
            raise ReleaseError(f"{where}: invalid dependency {dep!r}: {exc}") from exc
        if canonicalize_name(req.name) == CORE:
            return req, dep.strip()
    return None


def load_package(path: Path) -> Package:
    """Read one package directory.

    Args:
        path: The directory holding ``pyproject.toml``.

    Returns:
        The package description.
    """
    pyproject = path / "pyproject.toml"
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    project = data.get("project", {})
    dist = canonicalize_name(project.get("name", path.name))
    short = dist.removeprefix("tiering-")
    version_path = data.get("tool", {}).get("hatch", {}).get("version", {}).get("path")
    about = path / (version_path or f"src/tiering/{short.replace('-', '_')}/__about__.py")
    found = None if dist == CORE else core_requirement(project.get("dependencies", []), str(pyproject))
    eps = dict(project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))
    return Package(
        dist=dist,
        short=short,
        path=path,
        about=about,
        version=read_version(about),
        core_requirement=found[0] if found else None,
        core_requirement_text=found[1] if found else None,
        entry_points=eps,
    )


def load_packages(repo: Path) -> dict[str, Package]:
    """Read every ``packages/*/pyproject.toml`` of a repository.

    Args:
        repo: Repository root.

    Returns:
        Packages keyed by distribution name, core first, the others sorted.
    """
    found = [load_package(p.parent) for p in sorted((repo / "packages").glob("*/pyproject.toml"))]
    if not found:
        raise ReleaseError(f"{repo}: no packages/*/pyproject.toml found")
    found.sort(key=lambda p: (not p.is_core, p.dist))
    return {p.dist: p for p in found}


def resolve_package(name: str, packages: dict[str, Package]) -> Package:
    """Map a user-given package name to a package.

    Args:
        name: ``fs``, ``tiering-fs``, ``tiering_fs`` or ``packages/tiering-fs`` (trailing slash allowed).
        packages: The packages of the repository.

    Returns:
        The matching package.

    Raises:
        ReleaseError: When no package matches.
    """
    raw = name.rstrip("/").split("/")[-1]
    key = canonicalize_name(raw)
    for candidate in (key, f"tiering-{key}"):
        if candidate in packages:
            return packages[candidate]
    known = ", ".join(p.short for p in packages.values())
    raise ReleaseError(f"unknown package {name!r}; known: {known}")


def core_version(packages: dict[str, Package]) -> Version:
    """The current tiering-core version of the tree."""
    if CORE not in packages:
        raise ReleaseError("packages/tiering-core is missing")
    return packages[CORE].version


def admits(specifier: SpecifierSet, version: Version) -> bool:
    """Whether a specifier admits a version (pre-releases count as admitted when in range)."""
    return specifier.contains(version, prereleases=True)


def git(repo: Path, *args: str, check: bool = True) -> str:
    """Run a git command in a repository and return its stripped stdout.

    Args:
        repo: Repository root.
        *args: Git arguments.
        check: Raise ReleaseError on a non-zero exit.

    Returns:
        The command's standard output without surrounding whitespace.
    """
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()


def core_tags(repo: Path) -> dict[Version, str]:
    """Released tiering-core versions, from the ``tiering-core-v<version>`` tags.

    Args:
        repo: Repository root.

    Returns:
        Tag name keyed by version (tags whose suffix is not a version are skipped).
    """
    out = git(repo, "tag", "--list", f"{CORE}-v*")
    tags: dict[Version, str] = {}
    for tag in out.splitlines():
        try:
            tags[Version(tag.removeprefix(f"{CORE}-v"))] = tag
        except InvalidVersion:
            continue
    return tags
