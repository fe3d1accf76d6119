"""Hatchling build hook of tiering-fs: compiles the native batch path, ``libblockio.so``.

The library (``src/tiering/fs/native/_blockio.c`` with the vendored
``xxhash.h``) is a plain shared library without the Python C API, loaded with
ctypes, so one wheel serves every CPython: the wheel is tagged
``py3-none-<platform>``. Compiled with ``$CC`` (default ``cc``) and
``-O2 -shared -fPIC`` followed by ``$CFLAGS``.

- wheel: compiled into a temporary folder and added as
  ``tiering/fs/native/libblockio.so``;
- editable install (``pip install -e``): compiled next to the sources
  (``src/tiering/fs/native/libblockio.so``, ignored by git);
- no working compiler, or ``TIERING_FS_BUILD_NATIVE=0``: a pure wheel and a
  warning; the fs tier then uses its pure-Python block I/O path (install never
  fails for lack of a compiler).

Without hatchling, ``python hatch_build.py`` compiles the library next to the
sources (the development flow after editing the C file).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script: no hatchling needed
    BuildHookInterface = object  # type: ignore[assignment,misc]

NATIVE_DIR = Path("src/tiering/fs/native")
SOURCE = "_blockio.c"
LIBRARY = "libblockio.so"
WHEEL_PATH = "tiering/fs/native/" + LIBRARY


def compile_library(root: Path, out: Path) -> str | None:
    """Compile the library to ``out``; None when it worked, else why not (one line)."""
    if os.environ.get("TIERING_FS_BUILD_NATIVE", "").strip().lower() in ("0", "false", "off", "no"):
        return "TIERING_FS_BUILD_NATIVE=0"
    cc = shlex.split(os.environ.get("CC") or "cc")
    cmd = [*cc, "-O2", "-shared", "-fPIC", *shlex.split(os.environ.get("CFLAGS", ""))]
    cmd += ["-o", str(out), str(root / NATIVE_DIR / SOURCE)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{shlex.join(cmd)}: {exc}"
    if done.returncode != 0:
        return f"{shlex.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
    return None


def platform_tag() -> str:
    """This platform's wheel tag (``linux_x86_64``, ``macosx_11_0_arm64``...)."""
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def _warn(reason: str) -> None:
    print(
        f"WARNING: tiering-fs: native block I/O not built ({reason}); building a pure-Python wheel: "
        "the fs tier will use its pure-Python block I/O path (slower per block, same files).",
        file=sys.stderr,
    )


class NativeBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    """Compiles ``libblockio.so`` into the wheel (see the module doc)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Compile and add the library; mark the wheel platform-specific (nothing when it cannot be built)."""
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        if version == "editable":
            reason = compile_library(root, root / NATIVE_DIR / LIBRARY)
            if reason:
                _warn(reason)
            return
        self._tmp = tempfile.mkdtemp(prefix="tiering-fs-native-")
        out = Path(self._tmp) / LIBRARY
        reason = compile_library(root, out)
        if reason:
            _warn(reason)
            return
        build_data["force_include"][str(out)] = WHEEL_PATH
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{platform_tag()}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        """Remove the temporary build folder."""
        tmp = getattr(self, "_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    problem = compile_library(here, here / NATIVE_DIR / LIBRARY)
    print(problem or f"built {here / NATIVE_DIR / LIBRARY}")
    sys.exit(1 if problem else 0)
