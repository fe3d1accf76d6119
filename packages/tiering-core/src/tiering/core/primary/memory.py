"""How much memory this machine gives the CPU primary tier: physical memory and the cgroup limit.

``tiering check`` refuses a ``cpu_bytes_to_use`` larger than
:func:`machine_memory` (:func:`check_primary_fits`), and a failed allocation
of the primary tier is re-raised naming ``cpu_bytes_to_use``
(:func:`allocation_error`), instead of a bare ``[Errno 12] Cannot allocate
memory``. The cgroup limit is read as the kernel documents it
(``memory.max`` of cgroup v2, ``memory.limit_in_bytes`` of v1, found through
``/proc/self/cgroup``); a limit at or above physical memory counts as none.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from tiering.core.units import format_bytes as format_bytes  # re-exported: callers import it from here

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where the cgroup hierarchy is mounted."""
PROC_CGROUP = Path("/proc/self/cgroup")
"""This process's cgroup membership (``hierarchy:controllers:path`` lines)."""


@dataclasses.dataclass(frozen=True)
class MachineMemory:
    """Memory of this machine, in bytes.

    Attributes:
        physical: physical memory (``sysconf(SC_PHYS_PAGES) * SC_PAGE_SIZE``), None when unknown.
        cgroup_limit: the memory limit of this process's cgroup, None when there is none (or it is unknown).
    """

    physical: int | None
    cgroup_limit: int | None

    @property
    def available(self) -> int | None:
        """The smaller of the two (what a primary tier can have at most), None when both are unknown."""
        known = [n for n in (self.physical, self.cgroup_limit) if n is not None]
        return min(known) if known else None

    def describe(self) -> str:
        """``"physical memory 23.5 GiB, cgroup limit 8.0 GiB"`` (or ``"no cgroup limit"``)."""
        physical = "unknown" if self.physical is None else format_bytes(self.physical)
        limit = "no cgroup limit" if self.cgroup_limit is None else f"cgroup limit {format_bytes(self.cgroup_limit)}"
        return f"physical memory {physical}, {limit}"


def _physical() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2): no limit


def _cgroup_limit(physical: int | None) -> int | None:
    """The cgroup memory limit of this process (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), None: none."""
    candidates: list[Path] = []
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":
            candidates += [CGROUP_ROOT / rel / "memory.max", CGROUP_ROOT / "memory.max"]
        elif "memory" in controllers.split(","):
            candidates += [
                CGROUP_ROOT / "memory" / rel / "memory.limit_in_bytes",
                CGROUP_ROOT / "memory" / "memory.limit_in_bytes",
            ]
    for candidate in candidates:
        limit = _read_limit(candidate)
        if limit is not None:
            # v1 reports "no limit" as a huge number; a limit above physical memory changes nothing.
            return None if physical is not None and limit >= physical else limit
    return None


def machine_memory() -> MachineMemory:
    """This machine's physical memory and this process's cgroup memory limit."""
    physical = _physical()
    return MachineMemory(physical, _cgroup_limit(physical))


def check_primary_fits(cpu_bytes_to_use: int, memory: MachineMemory | None = None) -> None:
    """Refuse a primary tier larger than the memory this machine gives the process.

    Args:
        cpu_bytes_to_use: the primary tier's bytes.
        memory: the machine's memory; :func:`machine_memory` when None.

    Raises:
        ValueError: ``cpu_bytes_to_use`` exceeds the available memory (the message
            names the key, the value, physical memory and the cgroup limit).
    """
    memory = memory if memory is not None else machine_memory()
    available = memory.available
    if available is not None and cpu_bytes_to_use > available:
        raise ValueError(
            f"cpu_bytes_to_use: {cpu_bytes_to_use} bytes ({format_bytes(cpu_bytes_to_use)}) is more than this "
            f"machine's memory ({memory.describe()}); the CPU primary tier must fit in memory: lower "
            "cpu_bytes_to_use (inside vLLM it is the sum over the workers of this host)"
        )


def allocation_error(exc: BaseException, cpu_bytes_to_use: int) -> OSError:
    """The error to raise when allocating the primary tier of ``cpu_bytes_to_use`` bytes failed with ``exc``.

    Returns:
        An ``OSError`` (``errno`` ``ENOMEM``) naming ``cpu_bytes_to_use``, its
        value and the machine's memory; raise it ``from exc``.
    """
    import errno

    reason = getattr(exc, "strerror", None) or repr(exc)
    return OSError(
        errno.ENOMEM,
        f"cpu_bytes_to_use: cannot allocate the CPU primary tier of {cpu_bytes_to_use} bytes "
        f"({format_bytes(cpu_bytes_to_use)}): {reason}; this machine has {machine_memory().describe()}; "
        "lower cpu_bytes_to_use",
    )
