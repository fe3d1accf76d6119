"""The vLLM binding: tiering's secondary tiers inside vLLM's ``TieringOffloadingSpec``, on GPU and on CPU.

vLLM (``>= 0.32, < 0.34``: :data:`tiering.core.vllm.compat.SUPPORTED_RANGE`)
loads an out-of-tree secondary tier from ``kv_connector_extra_config`` by
importing ``module_path`` and taking the attribute named by ``type``. Point it
at :mod:`tiering.core.vllm.tiers`::

    {"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": "/mnt/kv"}

and it gets a subclass of vLLM's ``SecondaryTierManager`` wrapping the tier
that tiering's :data:`~tiering.core.factory.SecondaryTierFactory` resolves
for ``fs`` (any tier registered through the ``tiering.tiers`` entry points
works the same way). With ``"spec_name": "TieringSpec", "spec_module_path":
"tiering.core.vllm.spec"`` the same runs on vLLM's CPU backend as well
(:mod:`tiering.core.vllm.spec`). See ``docs/content/vllm.md``.

Modules: :mod:`~tiering.core.vllm.compat` (the version gate and every vLLM
import), :mod:`~tiering.core.vllm.translate` (vLLM's spec -> tiering's),
:mod:`~tiering.core.vllm.tier` (the tier wrapper),
:mod:`~tiering.core.vllm.cost` (the load cost model, block by block),
:mod:`~tiering.core.vllm.names` (which tier a ``type`` selects),
:mod:`~tiering.core.vllm.tiers` (the names vLLM resolves),
:mod:`~tiering.core.vllm.spec` and :mod:`~tiering.core.vllm.worker` (the
spec and its CPU worker), :mod:`~tiering.testing.vllm_driver` (test helpers).
Importing this package imports nothing from vLLM.
"""
