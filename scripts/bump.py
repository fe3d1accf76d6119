"""Release one package: bump its version, date its changelog, commit and tag.

Usage (from the repository root)::

    hatch run release:bump fs minor          # 0.1.0 -> 0.2.0
    hatch run release:bump tiering-core 0.2.0
    python scripts/bump.py packages/tiering-s3 patch --dry-run

The package is ``fs``, ``tiering-fs`` or ``packages/tiering-fs``; the version is
``major``, ``minor``, ``patch`` or an explicit PEP 440 version. The script

1. refuses a dirty work tree, a version that is not higher than the current one,
   an empty ``## Unreleased`` section, an existing tag, and a tiering-core version
   that another package's declared ``tiering-core`` range does not admit (it names
   the range to widen);
2. writes the version into the package's ``__about__.py``;
3. moves the ``## Unreleased`` notes of its ``CHANGELOG.md`` under
   ``## <version> - <YYYY-MM-DD>``, leaving an empty ``## Unreleased`` on top;
4. commits those two files only, as ``release tiering-<x> <version>``;
5. creates the annotated tag ``tiering-<x>-v<version>``.

It never pushes. Refusals exit with status 2, git failures with status 1.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

from _release import (
    CORE,
    REPO_ROOT,
    Package,
    ReleaseError,
    admits,
    core_version,
    git,
    load_packages,
    resolve_package,
    write_version,
)
from packaging.version import InvalidVersion, Version

_UNRELEASED_RE = re.compile(r"^##[ \t]+Unreleased[ \t]*$", re.MULTILINE | re.IGNORECASE)
_NEXT_HEADING_RE = re.compile(r"^##[ \t]", re.MULTILINE)


def next_version(current: Version, spec: str) -> Version:
    """Compute the new version from a bump keyword or an explicit version.

    ``major``/``minor``/``patch`` follow hatch's standard scheme: bump that part of
    the release, zero the parts after it, and drop any pre/post/dev suffix.

    Args:
        current: The version now in ``__about__.py``.
        spec: ``major``, ``minor``, ``patch`` or a PEP 440 version such as ``0.2.0``.

    Returns:
        The new version.

    Raises:
        ReleaseError: When ``spec`` is neither a keyword nor a version, or the result
            is not higher than ``current``.
    """
    major, minor, micro = (*current.release, 0, 0, 0)[:3]
    if spec == "major":
        new = Version(f"{major + 1}.0.0")
    elif spec == "minor":
        new = Version(f"{major}.{minor + 1}.0")
    elif spec == "patch":
        new = Version(f"{major}.{minor}.{micro + 1}")
    else:
        try:
            new = Version(spec)
        except InvalidVersion as exc:
            raise ReleaseError(f"{spec!r} is neither major, minor, patch nor a version like 1.2.3") from exc
    if new == current:
        raise ReleaseError(f"version {new} is the current version; choose a higher one")
    if new < current:
        raise ReleaseError(f"version {new} would be a downgrade from {current}")
    return new


def split_unreleased(text: str, where: str) -> tuple[str, str, str]:
    """Split a changelog into (head up to ``## Unreleased``, its notes, the rest).

    Args:
        text: The changelog's content.
        where: Path used in error messages.

    Returns:
        ``head`` ends with the ``## Unreleased`` line (and its newline), ``notes`` is
        the stripped text until the next ``## `` heading, ``rest`` starts at that
        heading (or is empty).

    Raises:
        ReleaseError: When there is no ``## Unreleased`` heading.
    """
    match = _UNRELEASED_RE.search(text)
    if match is None:
        raise ReleaseError(f"{where}: no '## Unreleased' heading")
    head = text[: match.end()] + "\n"
    body_start = match.end() + 1
    nxt = _NEXT_HEADING_RE.search(text, body_start)
    body_end = nxt.start() if nxt else len(text)
    return head, text[body_start:body_end].strip(), text[body_end:]


def dated_changelog(text: str, version: Version, date: datetime.date, where: str) -> str:
    """Move the ``## Unreleased`` notes under a dated version heading.

    Args:
        text: The changelog's content.
        version: The version being released.
        date: The release date.
        where: Path used in error messages.

    Returns:
        The new changelog: an empty ``## Unreleased``, then ``## <version> - <date>``
        with the notes, then the older sections unchanged.

    Raises:
        ReleaseError: When the Unreleased section is missing or empty.
    """
    head, notes, rest = split_unreleased(text, where)
    if not notes:
        raise ReleaseError(f"{where}: the '## Unreleased' section is empty; write the release notes first")
    new = f"{head}\n## {version} - {date.isoformat()}\n\n{notes}\n"
    if rest:
        new += f"\n{rest}"
    return new


def range_problems(package: Package, new: Version, packages: dict[str, Package]) -> list[str]:
    """Check that the tiering-core ranges still fit after the bump.

    Bumping core: every other package's ``tiering-core`` range must admit the new
    core version. Bumping a backend: its own range must admit the current core.

    Args:
        package: The package being bumped.
        new: Its new version.
        packages: Every package of the tree.

    Returns:
        One message per violated range (empty when all fit).
    """
    problems = []
    if package.is_core:
        for other in packages.values():
            spec = other.core_specifier
            if spec is not None and not admits(spec, new):
                problems.append(
                    f"{other.dist} requires {other.core_requirement_text}; widen it to admit {new} "
                    f"(packages/{other.path.name}/pyproject.toml) before releasing {CORE} {new}"
                )
    else:
        spec = package.core_specifier
        current = core_version(packages)
        if spec is not None and not admits(spec, current):
            problems.append(
                f"{package.dist} requires {package.core_requirement_text}, which does not admit the current "
                f"{CORE} {current}; "
                f"release {CORE} first or fix the range"
            )
    return problems


def dirty_paths(repo: Path) -> list[str]:
    """Paths git reports as modified, staged or untracked (ignored files excluded)."""
    out = git(repo, "status", "--porcelain", "--untracked-files=all")
    return [line[3:] for line in out.splitlines() if line.strip()]


def bump(repo: Path, name: str, spec: str, date: datetime.date, dry_run: bool = False) -> tuple[Package, Version]:
    """Release one package of ``repo``; see the module docstring for the steps.

    Args:
        repo: Repository root (a git work tree).
        name: The package (``fs``, ``tiering-fs`` or ``packages/tiering-fs``).
        spec: ``major``, ``minor``, ``patch`` or an explicit version.
        date: Date written into the changelog heading.
        dry_run: Check everything and print the plan, change nothing.

    Returns:
        The package (as before the bump) and its new version.

    Raises:
        ReleaseError: On any refusal.
    """
    git(repo, "rev-parse", "--show-toplevel")
    dirty = dirty_paths(repo)
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise ReleaseError(f"the work tree is dirty ({shown}); commit or stash first")
    packages = load_packages(repo)
    package = resolve_package(name, packages)
    new = next_version(package.version, spec)
    if not package.changelog.is_file():
        raise ReleaseError(f"{package.changelog.relative_to(repo)} is missing; it needs a '## Unreleased' section")
    rel_changelog = str(package.changelog.relative_to(repo))
    changelog = dated_changelog(package.changelog.read_text(encoding="utf-8"), new, date, rel_changelog)
    problems = range_problems(package, new, packages)
    if problems:
        raise ReleaseError("refusing, a tiering-core range does not fit:\n  " + "\n  ".join(problems))
    tag = f"{package.tag_prefix}{new}"
    if git(repo, "tag", "--list", tag):
        raise ReleaseError(f"tag {tag} already exists")
    message = f"release {package.dist} {new}"
    rel_about = str(package.about.relative_to(repo))
    if dry_run:
        print(f"would write {new} to {rel_about}, date {rel_changelog}, commit {message!r} and tag {tag}")
        return package, new
    write_version(package.about, new)
    package.changelog.write_text(changelog, encoding="utf-8")
    git(repo, "add", "--", rel_about, rel_changelog)
    git(repo, "commit", "--quiet", "-m", message, "--", rel_about, rel_changelog)
    git(repo, "tag", "-a", tag, "-m", f"{package.dist} {new}")
    print(f"{package.dist}: {package.version} -> {new}; committed {message!r}, tagged {tag}")
    print(f"next: hatch run release:build {package.short} && hatch run release:check; git push --follow-tags")
    return package, new


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 2 on a refusal, 1 on a git failure.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="fs, tiering-fs or packages/tiering-fs")
    parser.add_argument("version", help="major, minor, patch or an explicit version such as 0.2.0")
    parser.add_argument("--repo", type=Path, default=None, help="repository root (default: this script's repo)")
    parser.add_argument("--date", type=datetime.date.fromisoformat, default=None, help="release date, YYYY-MM-DD")
    parser.add_argument("--dry-run", action="store_true", help="check and print the plan; change nothing")
    args = parser.parse_args(argv)
    repo = (args.repo or REPO_ROOT).resolve()
    try:
        bump(repo, args.package, args.version, args.date or datetime.date.today(), dry_run=args.dry_run)
    except ReleaseError as exc:
        msg = str(exc)
        print(f"bump: {msg}", file=sys.stderr)
        return 1 if msg.startswith("git ") else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
