"""The targets of SGLang's flat calls (``get`` / ``set`` / ``batch_get`` / ``batch_set``), checked before any copy.

SGLang's flat interface takes each page in one of two forms:

- a contiguous CPU tensor of one page (SGLang's file backend's form, what
  its cache controller passes without ``interface_v1``), bytes in the host
  pool's flat-page order;
- an ``(address, bytes)`` pair, Mooncake's form: any number of bytes up to
  a page at an address; bytes the backend does not interpret, so they are
  taken under either ``interface_v1``. A value shorter than a page is a
  short value (:mod:`tiering.sglang.pages`).

:func:`flat_pages` turns what a call was given into one ``(address, bytes)``
per key, or raises ``ValueError`` naming the misuse (a stacked tensor, a
list of lists, a count or size that does not match); the backend then
answers the call as a failure with one logged error. Imports torch, not SGLang.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from tiering.sglang.pages import VALUE_TRAILER_BYTES


@dataclasses.dataclass(frozen=True)
class FlatPages:
    """A flat call's pages, checked.

    Attributes:
        keys: the keys, one per page.
        pages: per key, its ``(address, bytes)``.
        addresses: True for Mooncake's address form (bytes taken as they are, under either
            ``interface_v1``); False for page tensors.
    """

    keys: list[str]
    pages: list[tuple[int, int]]
    addresses: bool


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def answer_count(keys: Any) -> int:
    """How many answers a call of ``keys`` gets (0 for keys that are not a sized collection)."""
    try:
        return len(keys)
    except TypeError:
        return 0


def _keys(what: str, keys: Any) -> list[str]:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence) or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"{what}: keys must be a list of str, got {type(keys).__name__}")
    return list(keys)


def _tensor_page(what: str, key: str, value: Any, page_bytes: int) -> tuple[int, int]:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{what}: page of key {key!r} is a {type(value).__name__}, not a page tensor")
    if value.device.type != "cpu" or not value.is_contiguous():
        raise ValueError(f"{what}: page of key {key!r} is not a contiguous CPU tensor")
    size = value.numel() * value.element_size()
    if size != page_bytes:
        raise ValueError(f"{what}: page of key {key!r} is {size} bytes, pages are {page_bytes}")
    return int(value.data_ptr()), size


def _address_page(what: str, key: str, address: Any, size: Any, page_bytes: int) -> tuple[int, int]:
    if not is_int(address) or address <= 0 or not is_int(size):
        raise ValueError(f"{what}: key {key!r} needs an int address and an int size, got {address!r}, {size!r}")
    if size != page_bytes and not 0 < size <= page_bytes - VALUE_TRAILER_BYTES:
        raise ValueError(
            f"{what}: value of key {key!r} is {size} bytes; at most a page ({page_bytes}) less "
            f"{VALUE_TRAILER_BYTES}, or exactly a page"
        )
    return address, size


def flat_pages(what: str, keys: Any, tensors: Any, locations: Any, sizes: Any, page_bytes: int) -> FlatPages:
    """Check a flat call's arguments: page tensors (``tensors``) or addresses and sizes (``locations``, ``sizes``).

    Args:
        what: the call, for messages.
        keys: the call's keys (a list of str).
        tensors: one page tensor per key (``batch_set``'s ``values``, ``batch_get``'s targets), or None.
        locations: one address per key (Mooncake's form), or None.
        sizes: one byte count per key, with ``locations``.
        page_bytes: bytes of one page.

    Raises:
        ValueError: not a list of str keys; neither form, or counts that differ from the keys';
            a stacked tensor or a list of lists where a list of pages is expected; a tensor that
            is not one contiguous CPU page; a size over a page (or within 16 bytes of one).
    """
    names = _keys(what, keys)
    if tensors is not None:
        if isinstance(tensors, torch.Tensor):
            raise ValueError(f"{what}: pages must be a list of page tensors, got one stacked tensor")
        if not isinstance(tensors, Sequence) or len(tensors) != len(names):
            raise ValueError(f"{what}: {len(names)} keys need a list of {len(names)} page tensors")
        pages = [_tensor_page(what, k, v, page_bytes) for k, v in zip(names, tensors, strict=True)]
        return FlatPages(names, pages, False)
    if locations is None or sizes is None:
        raise ValueError(f"{what}: neither page tensors nor target locations and sizes were given")
    for label, values in (("target locations", locations), ("target sizes", sizes)):
        if isinstance(values, torch.Tensor) or not isinstance(values, Sequence) or len(values) != len(names):
            raise ValueError(f"{what}: {len(names)} keys need a list of {len(names)} {label}")
    pages = [_address_page(what, k, a, s, page_bytes) for k, a, s in zip(names, locations, sizes, strict=True)]
    return FlatPages(names, pages, True)
