"""Factories: registry, entry points, module_path (seeds 000 and 002)."""

import logging
import subprocess
import sys
import textwrap

import pytest

from tiering.core import OffloadingSpec, SecondaryTierManager, create_secondary_tier, create_spec
from tiering.core import factory as factory_mod
from tiering.core import registry as registry_mod
from tiering.core.factory import CachePolicyFactory, Registry, SecondaryTierFactory
from tiering.core.runtime.tiering_spec import TieringOffloadingSpec
from tiering.testing import requires_tier

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
    with pytest.raises(ValueError) as info:
        create_secondary_tier({"type": "zz"}, small_view, small_spec)
    assert (
        "If 'zz' is a secondary tier of the tiering project, install its distribution: pip install tiering-zz "
        "(from a clone of the repository: pip install ./packages/tiering-zz)."
    ) in str(info.value)
    # a close match is suggested instead of a distribution to install
    monkeypatch.setattr(SecondaryTierFactory, "_lazy", {**SecondaryTierFactory._lazy, "example": ("m", "C")})
    with pytest.raises(ValueError) as close:
        create_secondary_tier({"type": "exampel"}, small_view, small_spec)
    assert "(did you mean 'example'?)" in str(close.value) and "pip install" not in str(close.value)


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
    monkeypatch.setattr(registry_mod, "_warned", set())
    with caplog.at_level(logging.INFO, logger="tiering.core.registry"):
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


# -- C14: out-of-tree spec and cache policy errors name their config keys and the expected signature ----------
C14_MODULE = textwrap.dedent(
    """
    from tiering.core import LRUCachePolicy, TieringOffloadingSpec

    class OneArgSpec(TieringOffloadingSpec):
        def __init__(self, extra_config):  # the engine_config argument is missing
            super().__init__(extra_config)

    class PickySpec(TieringOffloadingSpec):
        def __init__(self, extra_config, engine_config=None):
            raise ValueError("model must be set for PickySpec")

    class TwoArgPolicy(LRUCachePolicy):
        def __init__(self, capacity, ghost_size):
            super().__init__(capacity)

    class FailingPolicy(LRUCachePolicy):
        def __init__(self, capacity):
            raise ValueError(f"capacity {capacity} is not a power of two")

    class HalfPolicy(LRUCachePolicy.__mro__[1]):  # CachePolicy without its abstract methods
        pass
    """
)


@pytest.fixture
def c14_module(tmp_path, monkeypatch):
    (tmp_path / "c14_oot.py").write_text(C14_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "c14_oot"
    sys.modules.pop("c14_oot", None)


def test_C14_spec_with_wrong_constructor_names_keys_and_signature(c14_module):
    config = {"cpu_bytes_to_use": 4096, "block_bytes": 4096, "spec_name": "OneArgSpec", "spec_module_path": c14_module}
    with pytest.raises(TypeError) as info:
        create_spec(config, engine_config=object())
    message = str(info.value)
    assert message.startswith("spec_name 'OneArgSpec' (spec_module_path 'c14_oot'): c14_oot.OneArgSpec(extra_config)")
    assert (
        "cannot be called as c14_oot.OneArgSpec(extra_config: Mapping[str, Any], engine_config: Any = None)" in message
    )
    assert "too many positional arguments" in message


def test_C14_spec_constructor_error_names_its_source(c14_module):
    config = {"cpu_bytes_to_use": 4096, "spec_name": "PickySpec", "spec_module_path": c14_module}
    with pytest.raises(ValueError, match=r"^spec_name 'PickySpec' \(spec_module_path 'c14_oot'\): model must be set"):
        create_spec(config)
    # first-party specs keep their own messages, which already name the key
    with pytest.raises(ValueError, match=r"^config key 'cpu_bytes_to_use' is required$"):
        create_spec({})


def test_C14_spec_import_errors_name_the_keys(c14_module):
    with pytest.raises(ImportError, match=r"^spec_name 'X' \(spec_module_path 'no_such_c14'\): cannot import"):
        create_spec({"cpu_bytes_to_use": 4096, "spec_name": "X", "spec_module_path": "no_such_c14"})
    with pytest.raises(AttributeError, match=r"^spec_name 'Nope' \(spec_module_path 'c14_oot'\): .*has no attribute"):
        create_spec({"cpu_bytes_to_use": 4096, "spec_name": "Nope", "spec_module_path": c14_module})
    with pytest.raises(
        TypeError, match=r"^spec_name 'TwoArgPolicy' .*not a subclass of tiering.core.spec.OffloadingSpec"
    ):
        create_spec({"cpu_bytes_to_use": 4096, "spec_name": "TwoArgPolicy", "spec_module_path": c14_module})
    with pytest.raises(ValueError, match=r"unknown offloading spec spec_name 'TieringOffloadingSpc' \(did you mean"):
        create_spec({"cpu_bytes_to_use": 4096, "spec_name": "TieringOffloadingSpc"})


def _policy_spec(name, module_path):
    return TieringOffloadingSpec(
        {
            "cpu_bytes_to_use": 4 * 4096,
            "block_bytes": 4096,
            "eviction_policy": name,
            "cache_policy_module_path": module_path,
        }
    )


def test_C14_cache_policy_with_wrong_constructor_names_keys_and_signature(c14_module):
    with pytest.raises(TypeError) as info:
        _policy_spec("TwoArgPolicy", c14_module).get_manager()
    message = str(info.value)
    assert message.startswith(
        "eviction_policy 'TwoArgPolicy' (cache_policy_module_path 'c14_oot'): "
        "c14_oot.TwoArgPolicy(capacity, ghost_size) cannot be called as c14_oot.TwoArgPolicy(capacity: int)"
    )
    assert "missing a required argument: 'ghost_size'" in message


def test_C14_cache_policy_errors_name_the_keys(c14_module):
    with pytest.raises(
        ValueError, match=r"^eviction_policy 'FailingPolicy' \(cache_policy_module_path 'c14_oot'\): capacity 4 is"
    ):
        _policy_spec("FailingPolicy", c14_module).create_primary()
    with pytest.raises(
        TypeError, match=r"^eviction_policy 'HalfPolicy' .*is abstract; it must implement access, evict"
    ):
        _policy_spec("HalfPolicy", c14_module).create_primary()
    with pytest.raises(
        ImportError, match=r"^eviction_policy 'X' \(cache_policy_module_path 'no_such_c14'\): cannot import"
    ):
        _policy_spec("X", "no_such_c14").create_primary()
    with pytest.raises(
        TypeError, match=r"^eviction_policy 'PickySpec' .*not a subclass of tiering.core.primary.policy"
    ):
        _policy_spec("PickySpec", c14_module).create_primary()
    with pytest.raises(ValueError, match=r"'eviction_policy' is 'lur' \(did you mean 'lru'\?\)"):
        TieringOffloadingSpec({"cpu_bytes_to_use": 4096, "block_bytes": 4096, "eviction_policy": "lur"})


def test_C14_tier_with_wrong_constructor_names_entry_and_signature(tmp_path, monkeypatch, small_spec, small_view):
    (tmp_path / "c14_tiers.py").write_text(
        "from tiering.core import SecondaryTierManager\n"
        "class TwoArgs(SecondaryTierManager):\n"
        "    lookup = submit_store = submit_load = get_finished = lambda *a: None\n"
        "    def __init__(self, offloading_spec, primary_kv_view, **kw):\n"
        "        super().__init__(offloading_spec, primary_kv_view, 'x')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError) as info:
        create_secondary_tier({"type": "TwoArgs", "module_path": "c14_tiers"}, small_view, small_spec, index=1)
    message = str(info.value)
    assert message.startswith(
        "secondary_tiers[1] (type 'TwoArgs'): c14_tiers.TwoArgs(offloading_spec, primary_kv_view, **kw)"
    )
    assert (
        "cannot be called as c14_tiers.TwoArgs(offloading_spec: OffloadingSpec, primary_kv_view: memoryview" in message
    )


# -- issue 15: a misspelled tier type gets a suggestion; constructor errors name the entry and key ------------
def test_misspelled_tier_type_gets_a_did_you_mean(monkeypatch, small_spec, small_view):
    monkeypatch.setattr(SecondaryTierFactory, "_lazy", {**SecondaryTierFactory._lazy, "example": ("m", "C")})
    with pytest.raises(
        ValueError, match=r"^secondary_tiers\[4\]: unknown secondary tier type 'exmaple' \(did you mean 'example'\?\)"
    ):
        create_secondary_tier({"type": "exmaple"}, small_view, small_spec, index=4)


def test_tier_os_error_names_the_entry_and_the_key(tmp_path, monkeypatch, small_spec, small_view):
    (tmp_path / "os_tiers.py").write_text(
        "import os\n"
        "from tiering.core import SecondaryTierManager\n"
        "class Rooted(SecondaryTierManager):\n"
        "    lookup = submit_store = submit_load = get_finished = lambda *a: None\n"
        "    def __init__(self, offloading_spec, primary_kv_view, tier_type, root='', capacity_bytes=0):\n"
        "        os.mkdir(os.path.join(root, 'ns', 'sub'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    root = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError) as info:
        create_secondary_tier(
            {"type": "Rooted", "module_path": "os_tiers", "root": root}, small_view, small_spec, index=2
        )
    assert info.value.errno == 2 and info.value.filename == f"{root}/ns/sub"
    assert str(info.value).startswith("[Errno 2] secondary_tiers[2].root: No such file or directory")


# -- a tier's config_schema: checked before construction, its secret keys redacted ---------------------------
SCHEMA_TIERS = textwrap.dedent(
    """
    from tiering.core import SecondaryTierManager
    from tiering.core.schema import ConfigKey, ConfigSchema, InvalidValueError

    class Schemed(SecondaryTierManager):
        config_schema = ConfigSchema("schemed", [
            ConfigKey("root", (str,), required=True, non_empty=True),
            ConfigKey("shared_key_material", (str,), secret=True),
            ConfigKey("fail", (bool,), default=False),
        ])
        lookup = submit_store = submit_load = get_finished = lambda *a: None

        def __init__(self, offloading_spec, primary_kv_view, tier_type, root, shared_key_material=None, fail=False):
            super().__init__(offloading_spec, primary_kv_view, tier_type)
            if fail == "schema":
                raise InvalidValueError(tier_type, "root", "is not a directory")
            if fail:
                raise ValueError(f"cannot open {root} with {shared_key_material}")
    """
)


@pytest.fixture
def schema_module(tmp_path, monkeypatch):
    (tmp_path / "schema_tiers.py").write_text(SCHEMA_TIERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "schema_tiers"
    sys.modules.pop("schema_tiers", None)


def test_schema_checks_the_entry_before_the_constructor(schema_module, small_spec, small_view):
    from tiering.core.factory import resolve_tier
    from tiering.core.schema import MissingKeyError, UnknownKeyError

    with pytest.raises(MissingKeyError, match=r"^secondary_tiers\[2\]\.root: required; expected a non-empty string"):
        resolve_tier({"type": "Schemed", "module_path": schema_module}, index=2)
    with pytest.raises(
        UnknownKeyError,
        match=r"^secondary_tiers\[0\]\.rooot: unknown key; accepted keys: admission, admission_sketch_bytes, fail, "
        r"root",
    ):
        resolve_tier({"type": "Schemed", "module_path": schema_module, "rooot": "/x"})
    tier = create_secondary_tier(
        {"type": "Schemed", "module_path": schema_module, "root": "/x"}, small_view, small_spec
    )
    assert type(tier).__name__ == "Schemed"


def test_tier_config_error_from_a_constructor_gets_its_entry(schema_module, small_spec, small_view):
    from tiering.core.schema import InvalidValueError

    entry = {"type": "Schemed", "module_path": schema_module, "root": "/x"}
    cls = SecondaryTierFactory.get_class("Schemed", schema_module)
    original = cls.__init__

    def failing(self, offloading_spec, primary_kv_view, tier_type, root, shared_key_material=None, fail=False):
        original(self, offloading_spec, primary_kv_view, tier_type, root, shared_key_material, fail="schema")

    cls.__init__ = failing
    try:
        with pytest.raises(
            InvalidValueError, match=r"^secondary_tiers\[5\]\.root: is not a directory \(tier 'Schemed'\)$"
        ):
            create_secondary_tier(entry, small_view, small_spec, index=5)
    finally:
        cls.__init__ = original


def test_schema_secret_keys_are_redacted_from_errors_and_reports(schema_module, monkeypatch, small_spec, small_view):
    from tiering.core.factory import redact_offloading_config

    material = "k3y-m4t3r14l-value"
    entry = {"type": "Schemed", "module_path": schema_module, "root": "/x", "shared_key_material": material}
    with pytest.raises(ValueError) as info:
        create_secondary_tier({**entry, "fail": True}, small_view, small_spec, index=1)
    assert str(info.value) == "secondary_tiers[1]: cannot open /x with ***"
    # reports: a registered tier's schema secrets are hidden, the generic rules apply to every entry
    monkeypatch.setattr(
        SecondaryTierFactory, "_lazy", {**SecondaryTierFactory._lazy, "schemed": (schema_module, "Schemed")}
    )
    monkeypatch.setattr(SecondaryTierFactory, "_loaded", dict(SecondaryTierFactory._loaded))
    config = {
        "cpu_bytes_to_use": 1 << 20,
        "secondary_tiers": [
            {"type": "schemed", "root": "/x", "shared_key_material": material},
            {"type": "not-installed", "password": "pw-123456", "shared_key_material": "visible"},
        ],
    }
    out = redact_offloading_config(config)
    assert out["secondary_tiers"][0] == {"type": "schemed", "root": "/x", "shared_key_material": "***"}
    assert out["secondary_tiers"][1] == {"type": "not-installed", "password": "***", "shared_key_material": "visible"}
    assert out["cpu_bytes_to_use"] == 1 << 20
    assert config["secondary_tiers"][0]["shared_key_material"] == material


def _registry(group: str = "tiering.test-none") -> Registry:
    return Registry("thing", SecondaryTierManager, group=group, name_key="type", path_key="module_path")


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_module_path_ignored_for_a_registered_name_is_warned_once(oot_module, monkeypatch, caplog):
    monkeypatch.setattr(registry_mod, "_warned", set())
    registry = _registry()
    registry.register("MyTier", oot_module, "Strict")
    with caplog.at_level(logging.WARNING, logger="tiering.core.registry"):
        for _ in range(3):
            assert registry.get_class("MyTier", "elsewhere").__name__ == "Strict"
    assert _warnings(caplog) == [
        f"thing 'MyTier' resolves to module {oot_module!r}; module_path 'elsewhere' is not imported "
        "(give the out-of-tree class another name)"
    ]


def test_two_distributions_with_one_name_are_warned_once_and_the_first_wins(oot_module, monkeypatch, caplog):
    from importlib.metadata import EntryPoint

    found = [
        EntryPoint("dup", f"{oot_module}:MyTier", "tiering.test-dup"),
        EntryPoint("dup", f"{oot_module}:Strict", "tiering.test-dup"),
        EntryPoint("dup", f"{oot_module}:MyTier", "tiering.test-dup"),  # the same one seen twice: no warning
    ]
    monkeypatch.setattr(registry_mod, "entry_points", lambda group: found if group == "tiering.test-dup" else [])
    monkeypatch.setattr(registry_mod, "_warned", set())
    registry = _registry("tiering.test-dup")
    with caplog.at_level(logging.WARNING, logger="tiering.core.registry"):
        assert registry.get_class("dup").__name__ == "MyTier"
        assert registry.known_names() == ["dup"]
    assert _warnings(caplog) == [
        f"thing 'dup' is provided by two installed distributions: an unknown distribution ('{oot_module}:MyTier', "
        f"used) and an unknown distribution ('{oot_module}:Strict', ignored)"
    ]


def test_entry_point_shadowed_by_a_registered_name_is_warned_once(oot_module, monkeypatch, caplog):
    from importlib.metadata import EntryPoint

    found = [EntryPoint("mine", f"{oot_module}:MyTier", "tiering.test-shadow")]
    monkeypatch.setattr(registry_mod, "entry_points", lambda group: found if group == "tiering.test-shadow" else [])
    monkeypatch.setattr(registry_mod, "_warned", set())
    registry = _registry("tiering.test-shadow")
    registry.register("mine", oot_module, "Strict")
    with caplog.at_level(logging.WARNING, logger="tiering.core.registry"):
        assert registry.get_class("mine").__name__ == "Strict"
        assert registry.get_class("mine").__name__ == "Strict"
    assert _warnings(caplog) == [
        f"thing 'mine' is registered in-process as {oot_module}:Strict; the installed entry point "
        f"'{oot_module}:MyTier' of an unknown distribution is not used"
    ]


def test_base_given_by_import_path_is_imported_on_first_resolution(oot_module):
    registry = Registry("thing", "tiering.core.base:SecondaryTierManager", "tiering.test-none", "type", "module_path")
    assert registry.get_class("MyTier", oot_module).__name__ == "MyTier"
    assert registry.base is SecondaryTierManager
    with pytest.raises(TypeError, match=r"not a subclass of tiering\.core\.base\.SecondaryTierManager"):
        registry.get_class("NotATier", oot_module)
