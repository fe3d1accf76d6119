"""The SGLang binding: tiering's secondary tiers as an SGLang HiCache storage backend (the L3 tier).

SGLang loads an out-of-tree storage backend with ``--hicache-storage-backend
dynamic`` and an extra config naming the class; point it at
:class:`tiering.sglang.storage.TieringHiCacheStorage`::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "tiering",
      "module_path": "tiering.sglang.storage", "class_name": "TieringHiCacheStorage",
      "interface_v1": 1, "tiering": {"secondary_tiers": [{"type": "fs", "root": "/mnt/kv"}]}}'

Any tier tiering's factory resolves (``fs``, ``s3``, ``redis``, ``example``,
an out-of-tree tier) serves SGLang this way. See ``docs/content/sglang.md``.

Modules: :mod:`~tiering.sglang.config` (the extra config and the
namespace), :mod:`~tiering.sglang.pages` (page geometry and the staging
buffer the tiers read and write), :mod:`~tiering.sglang.stack` (blocking,
thread-safe calls over the tiers), :mod:`~tiering.sglang.storage` (the
``HiCacheStorage`` subclass, the only module that imports SGLang).
Importing this package imports nothing from SGLang.
"""
