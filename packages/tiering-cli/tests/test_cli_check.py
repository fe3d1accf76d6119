"""``tiering check`` on the configs users write: vLLM's form, sizes against the machine, mistakes named."""

import json

import pytest

from tiering.cli.main import main
from tiering.testing import requires_tier


def _write(tmp_path, config):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    return str(path)


def _vllm_config(entry, **extra):
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [entry], **extra},
    }


@requires_tier("example")
def test_check_accepts_the_binding_keys_of_a_vllm_form_entry(tmp_path, capsys):
    entry = {
        "type": "tiering_example",
        "module_path": "tiering.core.vllm.tiers",
        "model_revision": "0e9e39f",
        "kv_layout": "hnd",
        "locality": "LOCAL",
        "enable_kv_events": True,
        "backpressure": {"backpressure_cls": "EMABackpressureDetector"},
    }
    assert main(["check", _write(tmp_path, _vllm_config(entry))]) == 0
    out = capsys.readouterr().out
    assert "binding keys backpressure, enable_kv_events, kv_layout, locality, model_revision checked" in out
    assert "config ok" in out


@requires_tier("example")
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("enable_kv_events", "yes", "secondary_tiers[0].enable_kv_events: must be true or false, got 'yes'"),
        ("locality", "local", "secondary_tiers[0].locality: must be one of 'LOCAL', 'REMOTE', got 'local'"),
        ("model_revision", 7, "secondary_tiers[0].model_revision: must be a non-empty string, got 7"),
        ("backpressure", "ema", "secondary_tiers[0].backpressure: must be an object, got 'ema'"),
    ],
)
def test_check_names_a_wrong_binding_key(tmp_path, capsys, key, value, message):
    entry = {"type": "tiering_example", "module_path": "tiering.core.vllm.tiers", key: value}
    assert main(["check", _write(tmp_path, _vllm_config(entry))]) == 2
    assert message in capsys.readouterr().err


@requires_tier("example")
def test_binding_keys_stay_unknown_in_a_plain_entry(tmp_path, capsys):
    config = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "example", "model_revision": "main"}]}
    assert main(["check", _write(tmp_path, config)]) == 2
    assert "secondary_tiers[0].model_revision: unknown key" in capsys.readouterr().err


@requires_tier("example")
def test_check_reads_the_binding_spec_for_vllm_without_vllm(tmp_path, capsys):
    entry = {"type": "tiering_example", "module_path": "tiering.core.vllm.tiers"}
    config = _vllm_config(entry, spec_name="TieringSpec", spec_module_path="tiering.core.vllm.spec")
    assert main(["check", _write(tmp_path, config)]) == 0
    out = capsys.readouterr().out
    assert "spec_name 'TieringSpec' with spec_module_path 'tiering.core.vllm.spec' is the vLLM binding's spec" in out
    assert "spec: tiering.core.runtime.tiering_spec.TieringOffloadingSpec" in out


# -- the primary tier against the machine's memory ---------------------------------------------
def test_check_refuses_a_primary_tier_larger_than_the_memory(tmp_path, capsys, monkeypatch):
    from tiering.core.primary import memory

    monkeypatch.setattr(memory, "machine_memory", lambda: memory.MachineMemory(8 << 30, 4 << 30))
    assert main(["check", _write(tmp_path, {"cpu_bytes_to_use": 6 << 30})]) == 2
    err = capsys.readouterr().err
    assert "cpu_bytes_to_use: 6442450944 bytes (6.0 GiB) is more than this machine's memory" in err
    assert "machine's memory (physical memory 8.0 GiB, cgroup limit 4.0 GiB);" in err
    assert main(["check", _write(tmp_path, {"cpu_bytes_to_use": 3 << 30})]) == 0


def test_machine_memory_reads_physical_memory_and_both_cgroup_versions(tmp_path, monkeypatch):
    from tiering.core.primary import memory

    assert memory.machine_memory().physical > 1 << 20  # this machine's, from sysconf
    proc = tmp_path / "cgroup"
    monkeypatch.setattr(memory, "PROC_CGROUP", proc)
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path)
    (tmp_path / "kube" / "pod").mkdir(parents=True)
    proc.write_text("0::/kube/pod\n")  # cgroup v2
    (tmp_path / "kube" / "pod" / "memory.max").write_text("4294967296\n")
    assert memory._cgroup_limit(8 << 30) == 4 << 30
    (tmp_path / "kube" / "pod" / "memory.max").write_text("max\n")
    assert memory._cgroup_limit(8 << 30) is None
    proc.write_text("4:memory:/docker/abc\n0::/\n")  # cgroup v1, mounted at the hierarchy's root in a container
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("2147483648\n")
    assert memory._cgroup_limit(8 << 30) == 2 << 30
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert memory._cgroup_limit(8 << 30) is None


def test_a_failed_primary_allocation_names_cpu_bytes_to_use(monkeypatch):
    import errno
    import mmap

    from tiering.core import TieringOffloadingSpec
    from tiering.core.primary import buffer

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(buffer, "mmap", type("m", (), {"mmap": staticmethod(refuse)}))
    spec = TieringOffloadingSpec({"cpu_bytes_to_use": 1 << 20, "block_bytes": 4096})
    with pytest.raises(
        OSError, match=r"cpu_bytes_to_use: cannot allocate the CPU primary tier of 1048576 bytes"
    ) as info:
        spec.create_primary()
    assert info.value.errno == errno.ENOMEM
    assert "; this machine has physical memory " in str(info.value)
    assert mmap.mmap is not refuse


def test_start_up_refuses_a_primary_tier_larger_than_the_memory_before_allocating(monkeypatch):
    from tiering.core import TieringOffloadingSpec
    from tiering.core.primary import memory

    monkeypatch.setattr(memory, "machine_memory", lambda: memory.MachineMemory(1 << 20, None))
    spec = TieringOffloadingSpec({"cpu_bytes_to_use": 2 << 20, "block_bytes": 4096})
    with pytest.raises(ValueError, match=r"^cpu_bytes_to_use: 2097152 bytes \(2\.0 MiB\) is more than this machine's"):
        spec.create_primary()


# -- tiers that cannot be built, caught without --probe; a raising tier in one line with it -----------------
BAD_TIERS = """
from tiering.core.base import SecondaryTierManager
from tiering.example.tier import ExampleSecondaryTierManager


class OneArgument(ExampleSecondaryTierManager):
    def __init__(self, spec):
        raise AssertionError("plain check must not construct a tier")


class Abstract(SecondaryTierManager):
    def __init__(self, offloading_spec, primary_kv_view, tier_type):
        raise AssertionError("plain check must not construct a tier")


class Raising(ExampleSecondaryTierManager):
    def __init__(self, offloading_spec, primary_kv_view, tier_type):
        raise RuntimeError("cannot reach the cluster")


class RaisingOSError(ExampleSecondaryTierManager):
    def __init__(self, offloading_spec, primary_kv_view, tier_type):
        open("/nonexistent/zzz")
"""


def _bad_tier_config(tmp_path, monkeypatch, name, **keys):
    (tmp_path / "bad_tiers_for_check.py").write_text(BAD_TIERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = {"type": name, "module_path": "bad_tiers_for_check", **keys}
    return _write(tmp_path, {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [entry]})


@requires_tier("example")
def test_c14_check_without_probe_refuses_a_tier_constructor_that_cannot_take_the_entry(tmp_path, capsys, monkeypatch):
    assert main(["check", _bad_tier_config(tmp_path, monkeypatch, "OneArgument")]) == 2
    captured = capsys.readouterr()
    assert "config ok" not in captured.out
    assert (
        "secondary_tiers[0] (type 'OneArgument'): bad_tiers_for_check.OneArgument(spec) cannot be called as "
        "bad_tiers_for_check.OneArgument(offloading_spec: OffloadingSpec, primary_kv_view: memoryview, "
        "tier_type: str, **tier_keys): too many positional arguments"
    ) in captured.err


@requires_tier("example")
def test_check_without_probe_refuses_an_abstract_tier_class(tmp_path, capsys, monkeypatch):
    assert main(["check", _bad_tier_config(tmp_path, monkeypatch, "Abstract")]) == 2
    captured = capsys.readouterr()
    assert "config ok" not in captured.out
    assert (
        "secondary_tiers[0] (type 'Abstract'): bad_tiers_for_check.Abstract is abstract; "
        "it must implement get_finished, lookup, submit_load, submit_store"
    ) in captured.err


@requires_tier("example")
def test_check_probe_reports_a_raising_tier_constructor_in_one_line(tmp_path, capsys, monkeypatch):
    path = _bad_tier_config(tmp_path, monkeypatch, "Raising")
    assert main(["check", path]) == 0  # its signature fits: only opening it fails
    capsys.readouterr()
    assert main(["check", path, "--probe"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("tiering check: error: secondary_tiers[0]: cannot reach the cluster (RuntimeError)\n")
    assert "Traceback" not in err


def test_check_says_cpu_bytes_to_use_must_hold_one_block(tmp_path, capsys):
    assert main(["check", _write(tmp_path, {"cpu_bytes_to_use": 65536, "block_bytes": 100000})]) == 2
    assert (
        "config key 'cpu_bytes_to_use' must be an integer of bytes >= 100000 (the primary tier must hold at least "
        "one block of block_bytes 100000) or a size with a unit (e.g. 4GiB, 256MiB, 500MB or 65536), got 65536"
    ) in capsys.readouterr().err


@requires_tier("example")
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("OneArgument", "bad_tiers_for_check.OneArgument(spec) cannot be called as "),
        ("Abstract", "bad_tiers_for_check.Abstract is abstract; it must implement "),
    ],
)
def test_c14_the_class_fault_is_named_before_an_unknown_key(tmp_path, capsys, monkeypatch, name, message):
    assert main(["check", _bad_tier_config(tmp_path, monkeypatch, name, url="http://x")]) == 2
    err = capsys.readouterr().err
    assert f"secondary_tiers[0] (type {name!r}): {message}" in err
    assert "unknown key" not in err


@requires_tier("example")
def test_check_probe_names_the_entry_then_an_os_error_and_its_type(tmp_path, capsys, monkeypatch):
    assert main(["check", _bad_tier_config(tmp_path, monkeypatch, "RaisingOSError"), "--probe"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        "tiering check: error: secondary_tiers[0]: No such file or directory: '/nonexistent/zzz' (FileNotFoundError)\n"
    )


@requires_tier("example")
def test_check_counts_schema_keys_in_words(tmp_path, capsys):
    assert (
        main(["check", _write(tmp_path, {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "example"}]})]) == 0
    )
    out = capsys.readouterr().out
    assert "every value checked against its schema (1 key)" in out
