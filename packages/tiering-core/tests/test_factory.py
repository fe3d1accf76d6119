"""Factories: registry, entry points, module_path (seeds 000 and 002)."""

import logging
import subprocess
import sys
import textwrap

import pytest

from tiering.core import OffloadingSpec, SecondaryTierManager, create_secondary_tier, create_spec
from tiering.core import factory as factory_mod
from tiering.core.factory import CachePolicyFactory, Registry, SecondaryTierFactory
from tiering.core.spec import TieringOffloadingSpec
from tiering.core.testing import requires_tier

OUT_OF_TREE = textwrap.dedent(
    """
    from tiering.core import SecondaryTierManager

    CREATED = []

    class MyTier(SecondaryTierManager):
        def __init__(self, offloading_spec, primary_kv_view, tier_type, root="/x", **extra):
            super().__init__(offloading_spec, primary_kv_view, tier_type)
            self.root = root
            self.extra = extra
            CREATED.append(self)

        def lookup(self, key, req_context):
            return False

        def submit_store(self, job):
            pass

        def submit_load(self, job):
            pass

        def get_finished(self):
            return []

    class Strict(MyTier):
        def __init__(self, offloading_spec, primary_kv_view, tier_type, root="/x"):
            if not root.startswith("/"):
                raise ValueError(f"tier {tier_type!r}: root must be absolute, got {root!r}")
            super().__init__(offloading_spec, primary_kv_view, tier_type, root=root)

    NotATier = dict
    """
)


@pytest.fixture
def oot_module(tmp_path, monkeypatch):
    (tmp_path / "my_oot_tiers.py").write_text(OUT_OF_TREE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_oot_tiers"
    sys.modules.pop("my_oot_tiers", None)


def test_create_tier_from_module_path(oot_module, small_spec, small_view):
    tier = create_secondary_tier({"type": "MyTier", "module_path": oot_module, "root": "/kv"}, small_view, small_spec)
    assert type(tier).__name__ == "MyTier"
    assert tier.tier_type == "MyTier"
    assert tier.root == "/kv"


def test_module_path_and_type_not_passed_to_constructor(oot_module, small_spec, small_view):
    tier = create_secondary_tier({"type": "MyTier", "module_path": oot_module, "a": 1}, small_view, small_spec)
    assert tier.extra == {"a": 1}


def test_module_path_invalid_module_raises(small_spec, small_view):
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        create_secondary_tier({"type": "X", "module_path": "no_such_module_xyz"}, small_view, small_spec)


def test_module_path_missing_attribute_names_it(oot_module, small_spec, small_view):
    with pytest.raises(AttributeError, match="'Nope'"):
        create_secondary_tier({"type": "Nope", "module_path": oot_module}, small_view, small_spec)


def test_module_path_not_subclass_raises(oot_module, small_spec, small_view):
    with pytest.raises(TypeError, match="not a subclass"):
        create_secondary_tier({"type": "NotATier", "module_path": oot_module}, small_view, small_spec)


def test_module_path_not_subclass_raises_under_python_O(oot_module, tmp_path):
    code = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        from tiering.core import OffloadingSpec, create_secondary_tier
        from tiering.core.primary import allocate_host_buffer
        spec = OffloadingSpec({{"cpu_bytes_to_use": 4096, "block_bytes": 4096}})
        try:
            config = {{"type": "NotATier", "module_path": "my_oot_tiers"}}
            create_secondary_tier(config, allocate_host_buffer(1, 4096), spec)
        except TypeError as e:
            print("TypeError", e)
        """
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("TypeError")


@requires_tier("example")
def test_unknown_type_message_lists_known_names_and_module_path(small_spec, small_view):
    with pytest.raises(ValueError) as info:
        create_secondary_tier({"type": "nfs"}, small_view, small_spec)
    message = str(info.value)
    assert "'nfs'" in message
    assert "'example'" in message  # tiering-example is installed in this environment
    assert "module_path" in message


def test_unknown_type_with_install_hint(monkeypatch, small_spec, small_view):
    monkeypatch.setattr(SecondaryTierFactory, "install_hints", {"fs": "tiering-fs", "zz": "tiering-zz"})
    with pytest.raises(ValueError, match="pip install tiering-zz"):
        create_secondary_tier({"type": "zz"}, small_view, small_spec)


@requires_tier("example")
def test_missing_type_names_the_index(small_spec):
    spec = TieringOffloadingSpec(
        {"cpu_bytes_to_use": 8 * 4096, "block_bytes": 4096, "secondary_tiers": [{"type": "example"}, {"root": "/x"}]}
    )
    with pytest.raises(ValueError, match=r"secondary_tiers\[1\] has no 'type'"):
        spec.get_manager()


def test_unknown_constructor_key_names_tier_and_key(oot_module, small_spec, small_view):
    with pytest.raises(TypeError, match=r"secondary_tiers\[0\] \(type 'Strict'\): unknown key 'rooot'"):
        create_secondary_tier({"type": "Strict", "module_path": oot_module, "rooot": "/x"}, small_view, small_spec)


def test_bad_value_error_names_the_entry_index(oot_module, small_spec, small_view):
    entry = {"type": "Strict", "module_path": oot_module, "root": "kv"}
    with pytest.raises(ValueError, match=r"^secondary_tiers\[3\]: tier 'Strict': root must be absolute, got 'kv'$"):
        create_secondary_tier(entry, small_view, small_spec, index=3)


def test_out_of_tree_warning_logged_once(oot_module, small_spec, small_view, monkeypatch, caplog):
    monkeypatch.setattr(factory_mod, "_warned_out_of_tree", False)
    with caplog.at_level(logging.INFO, logger="tiering.core.factory"):
        for _ in range(3):
            create_secondary_tier({"type": "MyTier", "module_path": oot_module}, small_view, small_spec)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r for r in caplog.records if r.levelno == logging.INFO and "MyTier" in r.getMessage()]
    assert [w.getMessage() for w in warnings] == [factory_mod.OUT_OF_TREE_WARNING]
    assert len(infos) == 3 and oot_module in infos[0].getMessage()


def test_register_is_lazy_and_rejects_duplicates(oot_module):
    registry = Registry(
        "thing", SecondaryTierManager, group="tiering.test-none", name_key="type", path_key="module_path"
    )
    registry.register("mine", "module_that_does_not_exist_yet", "MyTier")  # nothing imported now
    with pytest.raises(ValueError, match="already registered"):
        registry.register("mine", oot_module, "MyTier")
    with pytest.raises(ImportError, match="module_that_does_not_exist_yet"):
        registry.get_class("mine")
    registry.register("ok", oot_module, "MyTier")
    assert registry.get_class("ok").__name__ == "MyTier"
    assert registry.known_names() == ["mine", "ok"]


def test_registry_resolves_before_module_path(oot_module):
    registry = Registry(
        "thing", SecondaryTierManager, group="tiering.test-none", name_key="type", path_key="module_path"
    )
    registry.register("MyTier", oot_module, "Strict")
    assert registry.get_class("MyTier", oot_module).__name__ == "Strict"


@requires_tier("example")
def test_entry_point_tier_resolves_with_provider():
    cls = SecondaryTierFactory.get_class("example")
    assert cls.__name__ == "ExampleSecondaryTierManager"
    assert SecondaryTierFactory.provider("example").startswith("tiering-example ")


def test_cache_policy_factory_and_bad_value():
    assert CachePolicyFactory.get_class("arc").__name__ == "ARCCachePolicy"
    with pytest.raises(ValueError, match=r"'eviction_policy' is 'fifo'; allowed: 'lru', 'arc'"):
        TieringOffloadingSpec({"cpu_bytes_to_use": 4096, "block_bytes": 4096, "eviction_policy": "fifo"})


def test_custom_cache_policy_by_module_path(tmp_path, monkeypatch):
    (tmp_path / "my_policy.py").write_text(
        "from tiering.core.primary import LRUCachePolicy\n"
        "class Fifo(LRUCachePolicy):\n    def access(self, key):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = TieringOffloadingSpec(
        {
            "cpu_bytes_to_use": 4 * 4096,
            "block_bytes": 4096,
            "eviction_policy": "Fifo",
            "cache_policy_module_path": "my_policy",
        }
    )
    assert type(spec.create_primary().policy).__name__ == "Fifo"


def test_spec_factory_default_and_unknown():
    spec = create_spec({"cpu_bytes_to_use": 4096, "block_bytes": 4096})
    assert isinstance(spec, TieringOffloadingSpec)
    with pytest.raises(ValueError, match="spec_module_path"):
        create_spec({"cpu_bytes_to_use": 4096, "spec_name": "Nope"})


def test_spec_errors_name_the_key():
    with pytest.raises(ValueError, match="'cpu_bytes_to_use' is required"):
        OffloadingSpec({})
    with pytest.raises(ValueError, match="'block_size' must be an integer"):
        OffloadingSpec({"cpu_bytes_to_use": 1 << 20, "block_size": "16"})
    with pytest.raises(ValueError, match="'secondary_tiers' must be a list"):
        TieringOffloadingSpec({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": {"type": "fs"}})


def test_engine_config_stays_reachable():
    engine = object()
    spec = create_spec({"cpu_bytes_to_use": 1 << 20}, engine)
    assert spec.engine_config is engine


def test_namespace_digest_changes_with_every_field():
    base = {"cpu_bytes_to_use": 1 << 20, "block_bytes": 4096, "model": "m", "model_revision": "r1"}
    digests = {OffloadingSpec(base).namespace.digest}
    for key, value in [
        ("model_revision", "r2"),
        ("kv_dtype", "float8_e4m3fn"),
        ("kv_layout", "other"),
        ("block_size", 32),
        ("block_bytes", 8192),
        ("rank", 1),
        ("world_size", 2),
        ("model", "m2"),
    ]:
        digests.add(OffloadingSpec({**base, key: value}).namespace.digest)
    assert len(digests) == 9


def test_missing_backend_gets_an_install_hint(small_spec, small_view):
    missing = [n for n in ("example", "fs", "s3") if n not in SecondaryTierFactory.known_names()]
    if not missing:
        pytest.skip("every first-party backend is installed here")
    name = missing[0]
    with pytest.raises(ValueError, match=f"pip install tiering-{name}"):
        create_secondary_tier({"type": name}, small_view, small_spec)


def test_unknown_top_level_key_is_named_with_a_suggestion():
    with pytest.raises(ValueError, match=r"unknown config key 'secondary_tier' \(did you mean 'secondary_tiers'\?\)"):
        TieringOffloadingSpec({"cpu_bytes_to_use": 1 << 20, "secondary_tier": []})
    # vLLM's own keys are accepted, so one kv_connector_extra_config serves both
    spec = TieringOffloadingSpec({"cpu_bytes_to_use": 1 << 20, "tier_poll_interval_s": 0.001, "backpressure": {}})
    assert spec.num_primary_blocks == (1 << 20) // spec.block_bytes
    assert OffloadingSpec({"cpu_bytes_to_use": 1 << 20, "anything": 1}, strict=False).extra_config["anything"] == 1


def test_vllm_tier_name_standalone_gets_a_hint(small_spec, small_view):
    with pytest.raises(ValueError, match=r"vLLM binding's name of tier 'fs'.*standalone, write \"type\": 'fs'"):
        create_secondary_tier({"type": "tiering_fs"}, small_view, small_spec)
