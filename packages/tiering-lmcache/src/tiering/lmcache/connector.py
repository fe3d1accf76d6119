"""Our tiers in LMCache's in-process mode: a remote storage plugin (LMCache 0.5.6).

LMCache inside an engine (vLLM's ``LMCacheConnectorV1`` with an
``LMCACHE_CONFIG_FILE``) builds its remote backend from
``remote_storage_plugins``: for each name, ``extra_config`` gives
``remote_storage_plugin.<name>.module_path`` and ``.class_name``, and a
``RemoteConnector`` subclass found there is built with ``(loop,
local_cpu_backend, config)`` (LMCache's ``ConnectorManager`` and
``DynamicConnectorAdapter``, ``lmcache/v1/storage_backend/connector/__init__.py``).
:class:`TieringRemoteConnector` is such a class. It runs a
:class:`~tiering.lmcache.adapter.TieringL2Adapter` (the same staging rows,
worker thread, verified loads and usage accounting as in the multi-process
server) and waits for its tasks off the event loop (a batch of keys is one
lookup task and one load task)::

    remote_storage_plugins: ["tiering"]
    extra_config:
      remote_storage_plugin.tiering.module_path: tiering.lmcache.connector
      remote_storage_plugin.tiering.class_name: TieringRemoteConnector
      remote_storage_plugin.tiering.adapter_params:
        tier: {type: fs, root: /mnt/kv}

``adapter_params`` are the multi-process plugin's (:mod:`~tiering.lmcache.params`);
``object_bytes`` defaults to LMCache's full chunk (bytes of ``chunk_size``
tokens of the model's KV). Only full chunks are stored: a partial last
chunk (``save_unfull_chunk``) is not written, so it is a miss and LMCache
recomputes those tokens, as for any chunk a remote backend does not hold.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from tiering.lmcache import driver
from tiering.lmcache.adapter import TieringL2Adapter

logger = logging.getLogger(__name__)
T = TypeVar("T")
TASK_TIMEOUT_S = 60.0  # one store, lookup or load of one object; LMCache's own get has blocking_timeout_secs


def plugin_params(extra_config: Mapping[str, Any] | None, plugin_names: Any) -> dict[str, Any]:
    """The ``adapter_params`` of the one ``remote_storage_plugins`` entry that names this module's class.

    LMCache builds the connector without telling it its plugin name, so the
    entry is found by its ``module_path`` and ``class_name``.

    Args:
        extra_config: LMCache's ``extra_config`` (flat keys
            ``remote_storage_plugin.<name>.<field>``).
        plugin_names: LMCache's ``remote_storage_plugins``.

    Raises:
        ValueError: no entry or several entries name this class, or the
            entry's ``adapter_params`` is not a mapping (the key is named).
    """
    extra = dict(extra_config or {})
    ours = [
        name
        for name in plugin_names or ()
        if extra.get(f"remote_storage_plugin.{name}.module_path") == __name__
        and extra.get(f"remote_storage_plugin.{name}.class_name") == TieringRemoteConnector.__name__
    ]
    if len(ours) != 1:
        raise ValueError(
            f"expected one remote_storage_plugins entry with module_path {__name__!r} and class_name "
            f"{TieringRemoteConnector.__name__!r} in extra_config, found {len(ours)}: {ours}"
        )
    key = f"remote_storage_plugin.{ours[0]}.adapter_params"
    params = extra.get(key)
    if not isinstance(params, Mapping):
        raise ValueError(f"extra_config {key!r} must be a mapping with at least 'tier', got {params!r}")
    return dict(params)


def object_key(key: Any) -> Any:
    """LMCache's ``ObjectKey`` for an in-process ``CacheEngineKey`` (or ``LayerCacheEngineKey``).

    The chunk hash is the SHA-256 of the key's full string form (model,
    world size, worker, chunk hash, dtype, tags, layer), so every field of
    it keeps objects apart; the worker id is the KV rank.
    """
    return ObjectKey(
        chunk_hash=hashlib.sha256(key.to_string().encode()).digest(),
        model_name=key.model_name.replace("@", "_"),
        kv_rank=int(key.worker_id),
    )


class TieringRemoteConnector(RemoteConnector):  # type: ignore[misc]
    """LMCache ``RemoteConnector`` over one tiering tier, for LMCache's in-process mode.

    Args:
        loop: LMCache's event loop (the remote backend's thread).
        local_cpu_backend: LMCache's ``LocalCPUBackend``; loads allocate
            their L1 objects (full chunks) from it.
        config: LMCache's ``LMCacheEngineConfig``; see :func:`plugin_params`.

    Raises:
        ValueError, TypeError: a bad or missing ``adapter_params`` key (named).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: Any) -> None:
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        params = plugin_params(config.extra_config, config.remote_storage_plugins)
        params.setdefault("object_bytes", self.full_chunk_size_bytes)
        self.loop, self.local_cpu_backend = loop, local_cpu_backend
        self.adapter = TieringL2Adapter(params)

    async def _off_loop(self, call: Callable[[], T]) -> T:
        return await self.loop.run_in_executor(None, call)

    def _hit_prefix(self, keys: list[Any]) -> int:
        """How many of ``keys``, from the first, the tier holds (one lookup; its locks released at once)."""
        okeys = [object_key(k) for k in keys]
        hits = set(driver.lookup_and_lock(self.adapter, okeys, TASK_TIMEOUT_S))
        if hits:
            self.adapter.submit_unlock([okeys[i] for i in sorted(hits)])
        return next((i for i in range(len(keys)) if i not in hits), len(keys))

    def exists_sync(self, key: Any) -> bool:
        """Whether the tier holds ``key``'s object."""
        return self._hit_prefix([key]) == 1

    async def exists(self, key: Any) -> bool:
        """:meth:`exists_sync`, off the event loop."""
        return await self._off_loop(lambda: self.exists_sync(key))

    def support_batched_contains(self) -> bool:
        """Yes: :meth:`batched_contains` is one lookup task."""
        return True

    def batched_contains(self, keys: list[Any]) -> int:
        """How many of ``keys``, from the first, the tier holds (one lookup task)."""
        return self._hit_prefix(list(keys))

    async def batched_async_contains(self, lookup_id: str, keys: list[Any], pin: bool = False) -> int:
        """How many of ``keys``, from the first, the tier holds: one lookup task for all of them."""
        return await self._off_loop(lambda: self._hit_prefix(list(keys)))

    def _put(self, key: Any, memory_obj: Any) -> None:
        if len(memory_obj.byte_array) != self.adapter.params.object_bytes:
            logger.debug("not storing a partial chunk (%d bytes) of %s", len(memory_obj.byte_array), key)
            return
        result = driver.store(self.adapter, [object_key(key)], [memory_obj], TASK_TIMEOUT_S)
        if not result.is_successful():
            raise OSError(f"tiering: storing {key.to_string()} failed")

    async def put(self, key: Any, memory_obj: Any) -> None:
        """Store ``memory_obj`` (a full chunk) under ``key``; returns when the tier has it.

        Raises:
            OSError: the tier failed to store it (LMCache logs it and counts a failed put).
        """
        await self._off_loop(lambda: self._put(key, memory_obj))

    def _get_many(self, keys: list[Any]) -> list[Any]:
        """Per key a new full-chunk L1 object holding its verified bytes, or ``None`` (a miss or failed load).

        One lookup task and one load task for all keys; a buffer whose load
        failed is released, never handed out.
        """
        okeys = [object_key(k) for k in keys]
        hits = sorted(driver.lookup_and_lock(self.adapter, okeys, TASK_TIMEOUT_S))
        objs: list[Any] = [None] * len(keys)
        try:
            for i in hits:
                objs[i] = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
            todo = [i for i in hits if objs[i] is not None]
            if todo:
                loaded = driver.load(self.adapter, [okeys[i] for i in todo], [objs[i] for i in todo], TASK_TIMEOUT_S)
                done = {todo[j] for j in loaded}
                for i in todo:
                    if i not in done:
                        objs[i], failed = None, objs[i]
                        failed.ref_count_down()
            return objs
        except BaseException:
            for obj in objs:
                if obj is not None:
                    obj.ref_count_down()
            raise
        finally:
            if hits:
                self.adapter.submit_unlock([okeys[i] for i in hits])

    async def get(self, key: Any) -> Any:
        """The object of ``key`` in a new L1 object, every byte verified; ``None`` on a miss or failed load."""
        return (await self._off_loop(lambda: self._get_many([key])))[0]

    def support_batched_get(self) -> bool:
        """Yes: :meth:`batched_get` is one lookup and one load task."""
        return True

    async def batched_get(self, keys: list[Any]) -> list[Any]:
        """:meth:`get` for every key at once: per key its L1 object or ``None``."""
        return await self._off_loop(lambda: self._get_many(list(keys)))

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[Any]) -> list[Any]:
        """The L1 objects of the leading keys loaded, up to the first that was not (later ones released)."""
        objs = await self.batched_get(keys)
        ends = next((i for i, obj in enumerate(objs) if obj is None), len(objs))
        for obj in objs[ends:]:
            if obj is not None:
                obj.ref_count_down()
        return objs[:ends]

    async def list(self) -> list[str]:
        """Always empty: the tier's keys are digests of LMCache's, not the keys themselves."""
        return []

    async def close(self) -> None:
        """Close the adapter: tier jobs in flight finish, its threads stop."""
        await self._off_loop(self.adapter.close)
