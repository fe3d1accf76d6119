"""Tests of the release scripts: scripts/bump.py, scripts/check_dist.py, scripts/compat.py.

bump.py runs against a throwaway git repository holding copies of every
package's pyproject.toml, __about__.py and CHANGELOG.md; check_dist.py against
hand-made wheels (and a real build of tiering-example when `build` is installed).
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
PACKAGES = sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))
TODAY = datetime.date.today().isoformat()

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Release Test",
    "GIT_AUTHOR_EMAIL": "release-test@example.invalid",
    "GIT_COMMITTER_NAME": "Release Test",
    "GIT_COMMITTER_EMAIL": "release-test@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
GIT_ENV.pop("HATCH_ENV_ACTIVE", None)


def load_script(name: str) -> ModuleType:
    """Import scripts/<name>.py under a private module name (scripts/ is not a package)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))  # for `import _release`; appended so `build` stays the PyPI package
    module_name = f"_release_test_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], env=GIT_ENV, capture_output=True, text=True, check=True
    ).stdout.strip()


def run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), *args], env=GIT_ENV, capture_output=True, text=True, check=False
    )


def about_of(pkg_dir: Path) -> Path:
    return next((pkg_dir / "src" / "tiering").glob("*/__about__.py"))


def copy_tree(dest: Path) -> Path:
    """Copy every package's pyproject.toml, __about__.py and CHANGELOG.md into dest (same layout)."""
    for pkg in PACKAGES:
        target = dest / "packages" / pkg.name
        about = about_of(pkg)
        (target / about.parent.relative_to(pkg)).mkdir(parents=True)
        shutil.copy(pkg / "pyproject.toml", target / "pyproject.toml")
        shutil.copy(about, target / about.relative_to(pkg))
        changelog = f"# Changelog: {pkg.name}\n\n## Unreleased\n\n- Something new in {pkg.name}.\n"
        (target / "CHANGELOG.md").write_text(changelog, encoding="utf-8")
    return dest


def set_version(repo: Path, package: str, version: str) -> None:
    about = about_of(repo / "packages" / package)
    about.write_text(f'"""Version."""\n\n__version__ = "{version}"\n', encoding="utf-8")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with copies of the packages' release files, committed, clean."""
    dest = copy_tree(tmp_path / "repo")
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "initial")
    return dest


# --- bump.py ------------------------------------------------------------------------------


TIERS = ("example", "fs", "s3", "redis")
"""The distributions that provide a tier (a ``tiering.tiers`` entry point); the others are adapters and tools."""


def test_real_packages_are_releasable() -> None:
    rel = load_script("_release")
    bump = load_script("bump")
    packages = rel.load_packages(ROOT)
    assert set(packages) >= {"tiering-core", "tiering-example", "tiering-fs", "tiering-s3"}
    core = packages["tiering-core"].version
    for package in packages.values():
        assert package.changelog.is_file(), f"{package.dist} has no CHANGELOG.md"
        bump.split_unreleased(package.changelog.read_text(encoding="utf-8"), str(package.changelog))
        if not package.is_core:
            assert package.core_specifier is not None, f"{package.dist} does not depend on tiering-core"
            assert rel.admits(package.core_specifier, core), f"{package.dist} does not admit core {core}"
            if package.short in TIERS:
                assert package.entry_points, f"{package.dist} declares no tiering.tiers entry point"
            else:  # an engine adapter or a tool provides no tier
                assert not package.entry_points, f"{package.dist} declares a tiering.tiers entry point"


@pytest.mark.parametrize(
    "name", ["example", "tiering-example", "packages/tiering-example", "packages/tiering-example/"]
)
def test_bump_minor(repo: Path, name: str) -> None:
    old = load_script("_release").read_version(about_of(repo / "packages/tiering-example"))
    new = f"{old.major}.{old.minor + 1}.0"
    proc = run_script("bump", name, "minor", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    about = about_of(repo / "packages/tiering-example").read_text(encoding="utf-8")
    assert f'__version__ = "{new}"' in about
    changelog = (repo / "packages/tiering-example/CHANGELOG.md").read_text(encoding="utf-8")
    assert changelog == (
        f"# Changelog: tiering-example\n\n## Unreleased\n\n## {new} - {TODAY}\n\n- Something new in tiering-example.\n"
    )
    assert git(repo, "log", "-1", "--format=%s") == f"release tiering-example {new}"
    changed = git(repo, "show", "--name-only", "--format=", "HEAD").splitlines()
    assert sorted(changed) == sorted(
        [str(about_of(repo / "packages/tiering-example").relative_to(repo)), "packages/tiering-example/CHANGELOG.md"]
    )
    tag = f"tiering-example-v{new}"
    assert git(repo, "tag", "--list") == tag
    assert git(repo, "cat-file", "-t", tag) == "tag"  # annotated
    assert git(repo, "rev-parse", f"{tag}^{{commit}}") == git(repo, "rev-parse", "HEAD")
    assert git(repo, "status", "--porcelain") == ""


def test_bump_keeps_older_sections_and_explicit_version(repo: Path) -> None:
    changelog = repo / "packages/tiering-fs/CHANGELOG.md"
    changelog.write_text(
        "# Changelog\n\n## Unreleased\n\n- Faster reads.\n- Fixed a leak.\n\n## 0.1.0 - 2026-01-02\n\n- First.\n",
        encoding="utf-8",
    )
    set_version(repo, "tiering-fs", "0.1.0")
    git(repo, "commit", "-q", "-am", "notes")
    proc = run_script("bump", "fs", "0.1.5", "--repo", str(repo), "--date", "2026-11-29")
    assert proc.returncode == 0, proc.stderr
    assert changelog.read_text(encoding="utf-8") == (
        "# Changelog\n\n## Unreleased\n\n## 0.1.5 - 2026-11-29\n\n- Faster reads.\n- Fixed a leak.\n\n"
        "## 0.1.0 - 2026-01-02\n\n- First.\n"
    )
    assert git(repo, "tag", "--list") == "tiering-fs-v0.1.5"


@pytest.mark.parametrize(
    ("current", "spec", "expected"),
    [
        ("0.1.0", "patch", "0.1.1"),
        ("0.1.3", "minor", "0.2.0"),
        ("0.9.3", "major", "1.0.0"),
        ("0.2.0rc1", "patch", "0.2.1"),
        ("0.1.0", "0.1.0.post1", "0.1.0.post1"),
    ],
)
def test_next_version(current: str, spec: str, expected: str) -> None:
    assert load_script("bump").next_version(Version(current), spec) == Version(expected)


def test_refuses_dirty_tree(repo: Path) -> None:
    about = about_of(repo / "packages/tiering-example")
    about.write_text(about.read_text(encoding="utf-8") + "# edit\n", encoding="utf-8")
    proc = run_script("bump", "example", "patch", "--repo", str(repo))
    assert proc.returncode == 2
    assert "dirty" in proc.stderr and "__about__.py" in proc.stderr
    git(repo, "checkout", "--", ".")
    (repo / "stray.txt").write_text("x", encoding="utf-8")
    proc = run_script("bump", "example", "patch", "--repo", str(repo))
    assert proc.returncode == 2
    assert "dirty" in proc.stderr and "stray.txt" in proc.stderr
    assert git(repo, "tag", "--list") == ""


@pytest.mark.parametrize("target", ["0.0.9", "same"])
def test_refuses_downgrade_and_equal(repo: Path, target: str) -> None:
    set_version(repo, "tiering-example", "0.1.0")
    git(repo, "commit", "-q", "-am", "pin")
    version = "0.1.0" if target == "same" else target
    proc = run_script("bump", "example", version, "--repo", str(repo))
    assert proc.returncode == 2
    assert ("downgrade" if target != "same" else "current version") in proc.stderr
    assert git(repo, "log", "-1", "--format=%s") == "pin"


def test_refuses_empty_unreleased(repo: Path) -> None:
    (repo / "packages/tiering-fs/CHANGELOG.md").write_text(
        "# Changelog\n\n## Unreleased\n\n\n## 0.1.0 - 2026-01-01\n\n- First.\n", encoding="utf-8"
    )
    git(repo, "commit", "-q", "-am", "empty notes")
    proc = run_script("bump", "fs", "patch", "--repo", str(repo))
    assert proc.returncode == 2
    assert "Unreleased" in proc.stderr and "empty" in proc.stderr


def test_refuses_core_bump_outside_backend_range(repo: Path) -> None:
    for pkg in ("tiering-core", "tiering-example", "tiering-fs", "tiering-s3"):
        set_version(repo, pkg, "0.2.0" if pkg == "tiering-core" else "0.1.0")
    pyproject = repo / "packages/tiering-fs/pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    pyproject.write_text(text.replace('"tiering-core>=0.2,<0.3"', '"tiering-core>=0.2,<0.4"'), encoding="utf-8")
    git(repo, "commit", "-q", "-am", "fs admits 0.3")
    proc = run_script("bump", "core", "minor", "--repo", str(repo))
    assert proc.returncode == 2
    assert "tiering-example requires tiering-core>=0.2,<0.3; widen it to admit 0.3.0" in proc.stderr
    assert "tiering-s3 requires tiering-core>=0.2,<0.3; widen it to admit 0.3.0" in proc.stderr
    assert "tiering-fs requires" not in proc.stderr  # its range admits 0.3.0
    assert '__version__ = "0.2.0"' in about_of(repo / "packages/tiering-core").read_text(encoding="utf-8")
    assert git(repo, "tag", "--list") == ""
    # a patch release stays inside every range
    proc = run_script("bump", "core", "patch", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "tag", "--list") == "tiering-core-v0.2.1"


def test_refuses_backend_whose_range_excludes_current_core(repo: Path) -> None:
    set_version(repo, "tiering-core", "0.2.0")
    pyproject = repo / "packages/tiering-fs/pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    pyproject.write_text(text.replace('"tiering-core>=0.2,<0.3"', '"tiering-core>=0.3,<0.4"'), encoding="utf-8")
    git(repo, "commit", "-q", "-am", "fs needs 0.3")
    proc = run_script("bump", "fs", "patch", "--repo", str(repo))
    assert proc.returncode == 2
    assert "tiering-fs requires tiering-core>=0.3,<0.4, which does not admit the current tiering-core 0.2.0" in (
        proc.stderr
    )


def test_refuses_existing_tag_and_unknown_package(repo: Path) -> None:
    set_version(repo, "tiering-example", "0.1.0")
    git(repo, "commit", "-q", "-am", "pin")
    git(repo, "tag", "-a", "tiering-example-v0.1.1", "-m", "old")
    proc = run_script("bump", "example", "patch", "--repo", str(repo))
    assert proc.returncode == 2 and "tag tiering-example-v0.1.1 already exists" in proc.stderr
    proc = run_script("bump", "nope", "patch", "--repo", str(repo))
    assert proc.returncode == 2 and "unknown package 'nope'" in proc.stderr


def test_dry_run_changes_nothing(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    proc = run_script("bump", "s3", "patch", "--repo", str(repo), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "would write" in proc.stdout
    assert git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "tag", "--list") == ""


# --- check_dist.py ------------------------------------------------------------------------


def make_wheel(
    dist_dir: Path,
    dist: str,
    version: str,
    *,
    namespace_init: bool = False,
    py_typed: bool = True,
    entry_point: str | None = "default",
    core_requirement: str | None = "tiering-core<0.3,>=0.2",
    sdist: bool = True,
    urls: bool = True,
    data: dict[str, bytes] | None = None,
) -> Path:
    """Write a minimal wheel (and sdist) of a tiering package, shaped like hatchling's output.

    ``urls``: copy the package's ``[project.urls]`` into METADATA. ``data``: extra
    files (default: tiering-core's shipped traces, licence and attribution, from the tree).
    """
    short = dist.removeprefix("tiering-")
    stem = f"{dist.replace('-', '_')}-{version}"
    dist_dir.mkdir(parents=True, exist_ok=True)
    wheel = dist_dir / f"{stem}-py3-none-any.whl"
    info = f"{stem}.dist-info"
    meta = f"Metadata-Version: 2.4\nName: {dist}\nVersion: {version}\n"
    if core_requirement:
        meta += f"Requires-Dist: {core_requirement}\n"
    pyproject = ROOT / "packages" / dist / "pyproject.toml"
    if urls and pyproject.is_file():
        tomllib = load_script("_release").tomllib
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        meta += "".join(f"Project-URL: {label}, {url}\n" for label, url in project.get("urls", {}).items())
    if data is None and dist == "tiering-cli":
        data_dir = ROOT / "packages/tiering-cli/src/tiering/cli/bench/data"
        data = {f"tiering/cli/bench/data/{f.name}": f.read_bytes() for f in data_dir.iterdir()}
    cls = {"example": "ExampleSecondaryTierManager"}.get(short, "SomeTier")
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"tiering/{short}/__init__.py", f"from tiering.{short}.tier import {cls}\n")
        zf.writestr(f"tiering/{short}/__about__.py", f'__version__ = "{version}"\n')
        if py_typed:
            zf.writestr(f"tiering/{short}/py.typed", "")
        if namespace_init:
            zf.writestr("tiering/__init__.py", "")
        zf.writestr(f"{info}/METADATA", meta)
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        if entry_point == "default":
            entry_point = f"{short} = tiering.{short}:{cls}"
        if entry_point:
            zf.writestr(f"{info}/entry_points.txt", f"[tiering.tiers]\n{entry_point}\n")
        zf.writestr(f"{info}/RECORD", "")
        for name, content in (data or {}).items():
            zf.writestr(name, content)
    if sdist:
        (dist_dir / f"{stem}.tar.gz").write_bytes(b"")
    return wheel


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the packages' release files with fixed versions (no git needed)."""
    dest = copy_tree(tmp_path / "tree")
    set_version(dest, "tiering-core", "0.2.0")
    set_version(dest, "tiering-example", "0.1.0")
    text = (dest / "packages/tiering-example/pyproject.toml").read_text(encoding="utf-8")
    assert 'example = "tiering.example:ExampleSecondaryTierManager"' in text
    assert '"tiering-core>=0.2,<0.3"' in text
    return dest


def check(tree: Path, dist: Path) -> subprocess.CompletedProcess[str]:
    return run_script("check_dist", str(dist), "--repo", str(tree))


def test_check_dist_accepts_good_wheels(tree: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    make_wheel(dist, "tiering-example", "0.1.0")
    make_wheel(dist, "tiering-core", "0.2.0", entry_point=None, core_requirement=None)
    proc = check(tree, dist)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok   tiering_example-0.1.0-py3-none-any.whl" in proc.stdout
    assert "ok   tiering_core-0.2.0-py3-none-any.whl" in proc.stdout
    assert "example = tiering.example:ExampleSecondaryTierManager" in proc.stdout


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"namespace_init": True}, "ships tiering/__init__.py"),
        ({"version": "0.1.7"}, "METADATA Version 0.1.7 != __about__.py version 0.1.0"),
        ({"entry_point": None}, "the tiering.tiers entry point is missing"),
        ({"entry_point": "example = tiering.example:OtherTier"}, "pyproject.toml declares"),
        ({"py_typed": False}, "tiering/example/py.typed marker missing"),
        ({"core_requirement": "tiering-core>=0.3,<0.4"}, "does not admit the current tiering-core 0.2.0"),
        ({"core_requirement": None}, "no unconditional Requires-Dist on tiering-core"),
        ({"sdist": False}, "no sdist tiering_example-0.1.0.tar.gz"),
        ({"urls": False}, "METADATA Project-URL {} != [project.urls]"),
    ],
)
def test_check_dist_rejects(tree: Path, tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    dist = tmp_path / "dist"
    version = str(kwargs.pop("version", "0.1.0"))
    make_wheel(dist, "tiering-example", version, **kwargs)  # type: ignore[arg-type]
    proc = check(tree, dist)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAIL tiering_example-{version}-py3-none-any.whl" in proc.stdout
    assert message in proc.stdout


def test_check_dist_entry_point_class_must_exist(tree: Path, tmp_path: Path) -> None:
    pyproject = tree / "packages/tiering-example/pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    pyproject.write_text(text.replace(":ExampleSecondaryTierManager", ":Missing"), encoding="utf-8")
    dist = tmp_path / "dist"
    make_wheel(dist, "tiering-example", "0.1.0", entry_point="example = tiering.example:Missing")
    proc = check(tree, dist)
    assert proc.returncode == 1
    assert "Missing is not defined or imported in tiering/example/__init__.py" in proc.stdout


@pytest.mark.parametrize(
    ("drop", "change", "message"),
    [
        ("mooncake_conversation_trace.jsonl", None, "mooncake_conversation_trace.jsonl missing (shipped data)"),
        ("LICENSE-APACHE-2.0", None, "LICENSE-APACHE-2.0 missing (shipped data)"),
        (None, "README.md", "README.md lacks 'kvcache-ai/Mooncake'"),
        (None, "mooncake_synthetic_trace.jsonl", "mooncake_synthetic_trace.jsonl differs from"),
    ],
)
def test_check_dist_cli_ships_traces_with_licence_and_attribution(
    tree: Path, tmp_path: Path, drop: str | None, change: str | None, message: str
) -> None:
    data_dir = ROOT / "packages/tiering-cli/src/tiering/cli/bench/data"
    shutil.copytree(data_dir, tree / "packages/tiering-cli/src/tiering/cli/bench/data")
    data = {f"tiering/cli/bench/data/{f.name}": f.read_bytes() for f in data_dir.iterdir() if f.name != drop}
    if change:
        data[f"tiering/cli/bench/data/{change}"] = b"something else\n"
    dist = tmp_path / "dist"
    set_version(tree, "tiering-cli", "0.1.0")
    make_wheel(dist, "tiering-cli", "0.1.0", entry_point=None, data=data)
    proc = check(tree, dist)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL tiering_cli-0.1.0-py3-none-any.whl" in proc.stdout
    assert message in proc.stdout


def test_check_dist_fs_wheel_must_ship_the_native_library(tree: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    set_version(tree, "tiering-fs", "0.1.0")
    make_wheel(dist, "tiering-fs", "0.1.0", entry_point="fs = tiering.fs:FsspecSecondaryTierManager")
    proc = check(tree, dist)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tiering/fs/native/libblockio.so missing (native part" in proc.stdout
    assert "WHEEL Tag ['py3-none-any'] is not py3-none-<platform>" in proc.stdout
    assert "tiering_fs-0.1.0.tar.gz is not a readable sdist" in proc.stdout


def test_check_dist_empty_and_unknown(tree: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    proc = check(tree, dist)
    assert proc.returncode == 2 and "no wheel" in proc.stderr
    make_wheel(dist, "tiering-nope", "0.1.0")
    proc = check(tree, dist)
    assert proc.returncode == 1 and "is not a package of this tree" in proc.stdout


@pytest.mark.skipif(importlib.util.find_spec("build") is None, reason="needs the `build` package (release env)")
def test_check_dist_on_real_build(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    proc = run_script("build", "example", "core", "--outdir", str(dist))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = run_script("check_dist", str(dist))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok   ") == 2


def test_every_package_declares_project_urls() -> None:
    tomllib = load_script("_release").tomllib
    for pkg in PACKAGES:
        project = tomllib.loads((pkg / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        urls = project.get("urls", {})
        assert {"Homepage", "Documentation", "Source", "Changelog", "Issues"} <= set(urls), pkg.name
        assert urls["Source"].endswith(f"/packages/{pkg.name}") and urls["Changelog"].endswith(
            f"/{pkg.name}/CHANGELOG.md"
        )


# --- compat.py ----------------------------------------------------------------------------


def test_compat_chooses_oldest_tagged_and_current() -> None:
    compat = load_script("compat")
    tags = {Version("0.1.0"): "tiering-core-v0.1.0", Version("0.1.3"): "tiering-core-v0.1.3"}
    oldest, newest = compat.choose_cores(SpecifierSet(">=0.1.2,<0.2"), Version("0.1.5"), tags)
    assert (oldest.version, oldest.tag) == (Version("0.1.3"), "tiering-core-v0.1.3")
    assert (newest.version, newest.tag) == (Version("0.1.5"), None)
    # no release inside the range: the current tree is both oldest and newest
    oldest, newest = compat.choose_cores(SpecifierSet(">=0.1,<0.2"), Version("0.1.0"), {})
    assert oldest == newest and oldest.tag is None
    # the range excludes the current core: only a tagged release remains
    oldest, newest = compat.choose_cores(SpecifierSet(">=0.1,<0.2"), Version("0.2.0"), tags)
    assert oldest.tag == "tiering-core-v0.1.0" and newest is None


def test_compat_skips_in_one_line_while_core_has_one_version(repo: Path) -> None:
    proc = run_script("compat", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("compat: skipped: tiering-core 0.2.0 is the only core version")
    compat = load_script("compat")
    assert compat.single_core_version(repo) == Version("0.2.0")
    git(repo, "tag", "tiering-core-v0.0.9")
    assert compat.single_core_version(repo) is None  # a second version exists: the compat run is real


def test_compat_logs_default_under_ci_state() -> None:
    text = (SCRIPTS / "compat.py").read_text(encoding="utf-8")
    assert '".ci" / "state" / "compat-logs"' in text
    assert "gettempdir" not in text
