"""What a user sees with tiering-core plus some backends installed from wheels.

``TIERING_IT_BACKENDS`` (set by the hatch ``it`` matrix: none, example, fs,
s3, redis, all) says which backends this environment installed; without it the
expectations follow what is importable.
"""

import json
import os
import shutil
import subprocess
import sys
from importlib.util import find_spec

import pytest

from tiering.cli.bench import Replayer, synthetic_chat
from tiering.core import SecondaryTierFactory, TieringOffloadingSpec, create_secondary_tier
from tiering.core.primary import allocate_host_buffer

BACKENDS = ("example", "fs", "s3", "redis")


def _installed(name):
    try:
        return find_spec(f"tiering.{name}") is not None
    except ModuleNotFoundError:
        return False


def expected_backends():
    matrix = os.environ.get("TIERING_IT_BACKENDS")
    if matrix is None:
        return {b for b in BACKENDS if _installed(b)}
    return set(BACKENDS) if matrix == "all" else set() if matrix == "none" else {matrix}


INSTALLED = expected_backends()


@pytest.fixture(scope="module")
def s3_endpoint():
    if "s3" not in INSTALLED:
        pytest.skip("tiering-s3 not installed")
    from tiering.s3.testing import moto_server

    with moto_server("tiering-it") as server:
        yield server.connection()


@pytest.fixture(scope="module")
def redis_url():
    if "redis" not in INSTALLED:
        pytest.skip("tiering-redis not installed")
    from tiering.redis.testing import LocalRedis, have_redis_server

    if not have_redis_server():
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with LocalRedis(password="it-secret-pw") as server:
        yield f"redis://:it-secret-pw@127.0.0.1:{server.port}/0"


def tier_config(name, tmp_path, request):
    if name == "redis":
        return {"type": "redis", "url": request.getfixturevalue("redis_url"), "prefix": f"it-{tmp_path.name}"}
    if name == "example":
        return {"type": "example"}
    if name == "fs":
        (tmp_path / "kv").mkdir(exist_ok=True)  # the fs tier uses a root, it does not create one
        return {"type": "fs", "root": str(tmp_path / "kv")}
    return {"type": "s3", "prefix": f"it/{tmp_path.name}", **request.getfixturevalue("s3_endpoint")}


def test_installed_backends_are_what_the_matrix_installed():
    assert {b for b in BACKENDS if _installed(b)} == INSTALLED


@pytest.mark.parametrize("name", BACKENDS)
def test_type_names_resolve_or_give_install_hint(name):
    if name in INSTALLED:
        assert name in SecondaryTierFactory.known_names()
        assert SecondaryTierFactory.get_class(name).__module__.startswith(f"tiering.{name}")
        assert SecondaryTierFactory.provider(name).startswith(f"tiering-{name} ")
    else:
        with pytest.raises(ValueError, match=f"pip install tiering-{name}"):
            SecondaryTierFactory.get_class(name)


def test_no_tiering_init_in_installed_wheels():
    import tiering

    assert getattr(tiering, "__file__", None) is None


@pytest.mark.parametrize("name", BACKENDS)
def test_tiering_check_output(name, tmp_path, request):
    exe = shutil.which("tiering", path=os.path.dirname(sys.executable)) or shutil.which("tiering")
    assert exe, "the tiering command is not installed"
    config = {"cpu_bytes_to_use": 1 << 20, "block_bytes": 4096}
    if name in INSTALLED:
        config["secondary_tiers"] = [tier_config(name, tmp_path, request)]
    else:
        config["secondary_tiers"] = [{"type": name}]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    proc = subprocess.run([exe, "check", str(path), "--probe"], capture_output=True, text=True)
    if name in INSTALLED:
        assert proc.returncode == 0, proc.stderr
        assert f"type {name!r}: tiering.{name}." in proc.stdout
        assert f"(tiering-{name} 0." in proc.stdout
        assert "config ok" in proc.stdout
        entry = config["secondary_tiers"][0]
        probed = {  # from this tier's own entry: another backend's fixture would skip where that one is missing
            "example": "probe 'example': ok",
            "fs": f"probe 'fs' ({tmp_path / 'kv'}): ok",
            "s3": f"probe 's3' (s3://tiering-it/it/{tmp_path.name} at {entry.get('endpoint_url')}",
            "redis": f"probe 'redis' (redis://127.0.0.1:{entry.get('url', '').rsplit(':', 1)[-1]}",
        }
        assert probed[name] in proc.stdout, proc.stdout
        if name == "fs" and shutil.which("cc"):  # the installed wheel carries the native batch path
            assert "native batch block I/O (libblockio.so)" in proc.stdout, proc.stdout
        assert "aws_secret_access_key" not in proc.stdout and "'s'" not in proc.stdout
        assert "it-secret-pw" not in proc.stdout + proc.stderr
    else:
        assert proc.returncode == 2
        assert f"pip install tiering-{name}" in proc.stderr


@pytest.mark.parametrize("name", BACKENDS)
def test_replay_through_installed_tier(name, tmp_path, request):
    if name not in INSTALLED:
        pytest.skip(f"tiering-{name} not installed")
    spec = TieringOffloadingSpec(
        {
            "cpu_bytes_to_use": 16 * 4096,
            "block_bytes": 4096,
            "block_size": 256,
            "secondary_tiers": [tier_config(name, tmp_path, request)],
        }
    )
    manager = spec.get_manager()
    try:
        report = Replayer(manager, [f"0:{name}"]).run(synthetic_chat(60, 256, conversations=4))
    finally:
        manager.shutdown()
    assert report.hits[f"0:{name}"] > 0  # the primary (16 blocks) is too small: the tier serves
    assert report.verified_blocks == report.total_hits


def test_tier_built_from_wheel_passes_a_round_trip(tmp_path, request):
    if not INSTALLED:
        pytest.skip("no backend installed")
    name = sorted(INSTALLED)[0]
    spec = TieringOffloadingSpec({"cpu_bytes_to_use": 4 * 4096, "block_bytes": 4096})
    tier = create_secondary_tier(tier_config(name, tmp_path, request), allocate_host_buffer(4, 4096), spec)
    try:
        assert tier.tier_type == name
    finally:
        tier.shutdown()


def test_python_version_is_a_supported_one():
    assert sys.version_info[:2] >= (3, 10)


ADAPTERS = ("sglang", "lmcache")


@pytest.mark.skipif(os.environ.get("TIERING_IT_BACKENDS") != "all", reason="the adapters are installed with 'all' only")
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_an_adapter_wheel_imports_without_its_engine_and_its_old_path_warns(adapter):
    """tiering-sglang / tiering-lmcache from their wheels: no engine imported, the old import path forwards, warned."""
    code = (
        "import sys, warnings\n"
        f"import tiering.{adapter}\n"
        f"assert '{adapter}' not in sys.modules, 'the engine was imported'\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    import tiering.core.{adapter} as old\n"
        f"assert old.__doc__ and tiering.{adapter}.__doc__\n"
        "print(caught[0].message)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"tiering.core.{adapter} moved to tiering.{adapter} (distribution tiering-{adapter})" in out.stdout
