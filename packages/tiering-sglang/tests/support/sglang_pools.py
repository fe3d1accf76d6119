"""SGLang host pools on CPU for the binding's tests, their page methods taken from SGLang's own source.

SGLang's host pool classes (``pool_host/mha.py``, ``pool_host/mla.py``)
cannot be imported on a CPU machine without SGLang's kernel packages (the
import chain reaches ``tvm_ffi`` and CUDA kernels). Their page methods
(``get_page_buffer_meta``, ``get_data_page``, ``get_dummy_flat_data_page``,
``set_from_flat_data_page``) are plain torch code, so they are compiled here
from the installed SGLang's source file (``ast``) and bound to a small class
holding the attributes they read, over a ``kv_buffer`` of SGLang's shape.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from typing import Any

import torch

PAGE_METHODS = ("get_page_buffer_meta", "get_data_page", "get_dummy_flat_data_page", "set_from_flat_data_page")


def sglang_methods(
    relative: str, class_name: str, names: tuple[str, ...], module_globals: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The methods ``names`` of ``class_name`` in SGLang's ``sglang/srt/mem_cache/<relative>``, compiled from source.

    ``module_globals``: names the methods use from their module besides ``torch`` (``logger``...).
    """
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin is not None, "sglang is not installed"
    path = os.path.join(os.path.dirname(spec.origin), "srt", "mem_cache", relative)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    funcs = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {f.name for f in funcs} == set(names), f"{class_name} in {path} lacks some of {names}"
    namespace: dict[str, Any] = {"torch": torch, **(module_globals or {})}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), path, "exec"), namespace)
    return {name: namespace[name] for name in names}


def _pool_class(name: str, relative: str, class_name: str, names: tuple[str, ...]) -> type:
    return type(name, (), sglang_methods(relative, class_name, names))


def mha_host_pool(
    layout: str = "layer_first", pages: int = 16, page_size: int = 4, layers: int = 3, heads: int = 2, head_dim: int = 8
) -> Any:
    """An SGLang MHA host pool (``MHATokenToKVPoolHost``'s page methods) on CPU, bfloat16, random contents."""
    pool = _pool_class("MHAHostPool", "pool_host/mha.py", "MHATokenToKVPoolHost", PAGE_METHODS)()
    pool.layout, pool.page_size, pool.layer_num, pool.head_num, pool.head_dim = (
        layout,
        page_size,
        layers,
        heads,
        head_dim,
    )
    pool.size = pages * page_size
    pool.dtype, pool.device, pool.pin_memory = torch.bfloat16, "cpu", False
    dims = {
        "layer_first": (2, layers, pool.size, heads, head_dim),
        "page_first": (2, pool.size, layers, heads, head_dim),
    }[layout]
    pool.kv_buffer = torch.randn(dims).to(torch.bfloat16)
    return pool


def mla_host_pool(
    layout: str = "layer_first", pages: int = 16, page_size: int = 4, layers: int = 3, dim: int = 24
) -> Any:
    """An SGLang MLA host pool (``MLATokenToKVPoolHost``'s page meta) on CPU, bfloat16, random contents."""
    pool = _pool_class(
        "MLAHostPool", "pool_host/mla.py", "MLATokenToKVPoolHost", ("get_page_buffer_meta", "_storage_page_index")
    )()
    pool.layout, pool.page_size, pool.layer_num, pool.kv_cache_dim = layout, page_size, layers, dim
    pool.size = pages * page_size
    pool.dcp_size, pool.logical_page_size = 1, page_size
    pool.dtype, pool.device = torch.bfloat16, "cpu"
    dims = {"layer_first": (layers, pool.size, 1, dim), "page_first": (pool.size, layers, 1, dim)}[layout]
    pool.kv_buffer = torch.randn(dims).to(torch.bfloat16)
    return pool


def page_bytes_of(pool: Any, page: int) -> bytes:
    """The bytes of host page ``page`` (token indices ``page * page_size ...``), in page-meta order."""
    import ctypes

    indices = torch.arange(page * pool.page_size, (page + 1) * pool.page_size, dtype=torch.int64)
    pointers, sizes = pool.get_page_buffer_meta(indices)
    return b"".join(ctypes.string_at(p, s) for p, s in zip(pointers, sizes))


def sglang_storage_metrics() -> tuple[type, Any]:
    """SGLang's ``StorageMetrics`` dataclass and ``StorageMetricsCollector.log_storage_metrics``, compiled from source.

    Their module (``sglang.srt.observability.metrics_collector``) imports
    transformers and SGLang's model configs, which this CPU environment
    lacks; the class and the method are taken from its source as they are.
    """
    import dataclasses
    import typing

    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin is not None, "sglang is not installed"
    path = os.path.join(os.path.dirname(spec.origin), "srt", "observability", "metrics_collector.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    collector = classes["StorageMetricsCollector"]
    method = next(n for n in collector.body if isinstance(n, ast.FunctionDef) and n.name == "log_storage_metrics")
    namespace: dict[str, Any] = {
        "dataclass": dataclasses.dataclass,
        "field": dataclasses.field,
        "List": typing.List,  # noqa: UP006 - SGLang's own annotation
        "Optional": typing.Optional,
        "__name__": __name__,  # dataclass resolves the string annotations in a module that exists
    }
    exec(compile(ast.Module(body=[classes["StorageMetrics"], method], type_ignores=[]), path, "exec"), namespace)
    return namespace["StorageMetrics"], namespace["log_storage_metrics"]
