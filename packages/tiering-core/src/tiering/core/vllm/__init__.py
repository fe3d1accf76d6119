"""The vLLM binding: tiering's secondary tiers inside vLLM's ``TieringOffloadingSpec``.

vLLM (:data:`tiering.core.vllm.binding.SUPPORTED_VLLM_VERSIONS`) loads an
out-of-tree secondary tier from ``kv_connector_extra_config`` by importing
``module_path`` and taking the attribute named by ``type``. Point it at
:mod:`tiering.core.vllm.tiers`::

    {"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": "/mnt/kv"}

and it gets a subclass of vLLM's ``SecondaryTierManager`` wrapping the tier
that tiering's :data:`~tiering.core.factory.SecondaryTierFactory` resolves
for ``fs`` (any tier registered through the ``tiering.tiers`` entry points
works the same way). See ``docs/content/vllm.md``.

Importing this package imports nothing from vLLM; the submodules
:mod:`~tiering.core.vllm.binding` (the whole vLLM surface, with the version
check) and :mod:`~tiering.core.vllm.tiers` (the names vLLM resolves) do.
"""
