"""The LMCache binding: tiering's tiers as an LMCache L2 adapter (multi-process) or remote plugin (in-process).

LMCache's multi-process server (``lmcache.v1.multiprocess``, 0.5.6) loads an
out-of-tree L2 adapter from its L2 config::

    {"type": "plugin", "module_path": "tiering.lmcache.adapter",
     "class_name": "TieringL2Adapter",
     "adapter_params": {"object_bytes": "4MiB", "tier": {"type": "fs", "root": "/mnt/kv"}}}

and gets :class:`~tiering.lmcache.adapter.TieringL2Adapter`, a subclass
of LMCache's ``L2AdapterInterface`` that runs one tiering tier (any tier the
:data:`~tiering.core.factory.SecondaryTierFactory` resolves: fs, s3, redis,
example, out-of-tree). See ``docs/content/lmcache.md``.

Modules: :mod:`~tiering.lmcache.keys` (LMCache's ``ObjectKey`` -> our
key and namespace, and the stored row format; no LMCache import),
:mod:`~tiering.lmcache.params` (the ``adapter_params`` keys),
:mod:`~tiering.lmcache.worker` (the thread that drives the tier; no
LMCache import), :mod:`~tiering.lmcache.adapter` (the adapter;
imports LMCache), :mod:`~tiering.lmcache.connector` (the same adapter as a
remote storage plugin of LMCache's in-process mode, ``remote_storage_plugins``;
imports LMCache), :mod:`~tiering.lmcache.driver` (drives any L2
adapter as LMCache does, for tests and the benchmark; imports LMCache and
torch). Importing this package imports nothing from LMCache.
"""
