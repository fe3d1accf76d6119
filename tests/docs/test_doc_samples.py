"""Every code sample in docs/ and the README is executed or checked here.

- ``python`` blocks run, in page order, in one fresh module per page (the
  out-of-tree page's module is importable as ``my_tiers``, the name its JSON
  sample uses);
- ``json`` blocks that are configs resolve with the factories, as
  ``tiering check`` does (tiers whose package is not installed are skipped);
- ``toml`` blocks parse;
- ``console`` blocks: run whole, in a fresh venv, by test_console_blocks.py
  (README.md and docs/content);
- ``bash`` blocks: every ``--kv-transfer-config`` JSON for ``vllm serve``
  parses and each of its tiers resolves, through the binding's names, to an
  installed tiering tier that accepts its keys (vLLM itself runs in the
  vllm environment's tests); scripts named exist.
"""

import json
import re
import sys
import types
from pathlib import Path

import pytest

from tiering.cli.main import main as tiering_main

REPO = Path(__file__).resolve().parents[2]
PAGES = [
    *sorted((REPO / "docs" / "content").rglob("*.md")),
    REPO / "README.md",
    *sorted(REPO.glob("packages/*/README.md")),
]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


@pytest.fixture
def server_memory(monkeypatch):
    """The samples are sized for a serving host (e.g. a 32 GiB primary tier): check them as on a 2 TiB one."""
    from tiering.core.primary import memory

    monkeypatch.setattr(memory, "machine_memory", lambda: memory.MachineMemory(2 << 40, None))


def blocks(page, lang):
    return [body for kind, body in FENCE.findall(page.read_text()) if kind == lang]


def page_id(page):
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "python")], ids=page_id)
def test_python_samples_run(page, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("my_tiers")
    monkeypatch.setitem(sys.modules, "my_tiers", module)
    for body in blocks(page, "python"):
        exec(compile(body, f"{page.name}:python", "exec"), module.__dict__)


def installed_types():
    from tiering.core import SecondaryTierFactory

    return set(SecondaryTierFactory.known_names())


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "json")], ids=page_id)
def test_json_configs_resolve(page, tmp_path, monkeypatch, capsys, server_memory):
    # Configs naming module_path "my_tiers" use the tier class of the out-of-tree guide.
    module = types.ModuleType("my_tiers")
    guide = REPO / "docs" / "content" / "out-of-tree.md"
    for body in blocks(guide, "python"):
        exec(compile(body, f"{guide.name}:python", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "my_tiers", module)
    checked = 0
    for body in blocks(page, "json"):
        config = json.loads(body)
        extra = config.get("kv_connector_extra_config", config)
        if "cpu_bytes_to_use" not in extra:
            continue
        tiers = {t.get("type") for t in extra.get("secondary_tiers", []) if "module_path" not in t}
        if not tiers <= installed_types():
            continue
        path = tmp_path / "config.json"
        path.write_text(body)
        assert tiering_main(["check", str(path)]) == 0, capsys.readouterr().err
        checked += 1
    assert checked or not any("cpu_bytes_to_use" in b for b in blocks(page, "json"))


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "toml")], ids=page_id)
def test_toml_samples_parse(page):
    tomllib = pytest.importorskip("tomllib")
    for body in blocks(page, "toml"):
        assert tomllib.loads(body)


VLLM_CONFIG = re.compile(r"--kv-transfer-config\s+'(\{.*?\})'", re.S)
VLLM_OWN_KEYS = {"type", "module_path", "model_revision", "kv_layout", "locality", "backpressure", "enable_kv_events"}


def vllm_configs():
    for page in PAGES:
        for body in blocks(page, "bash"):
            for match in VLLM_CONFIG.finditer(body.replace("\\\n", " ")):
                yield pytest.param(page, match.group(1), id=page_id(page))


@pytest.mark.parametrize(("page", "text"), list(vllm_configs()))
def test_vllm_serve_configs_name_installed_tiers_with_valid_keys(page, text):
    from tiering.core import SecondaryTierFactory
    from tiering.core.factory import check_tier_keys

    config = json.loads(text)
    assert config["kv_connector"] == "OffloadingConnector"
    extra = config["kv_connector_extra_config"]
    # vLLM's own spec, or tiering's (vLLM's plus a worker for its CPU backend), loaded by spec_module_path
    assert (extra["spec_name"], extra.get("spec_module_path")) in {
        ("TieringOffloadingSpec", None),
        ("TieringSpec", "tiering.core.vllm.spec"),
    }
    assert extra["cpu_bytes_to_use"] > 0
    for index, tier in enumerate(extra["secondary_tiers"]):
        assert tier["module_path"] == "tiering.core.vllm.tiers"
        assert tier["type"].startswith("tiering_")
        name = tier["type"].removeprefix("tiering_")
        if name not in installed_types():
            pytest.skip(f"tier {name!r} not installed here")
        cls = SecondaryTierFactory.get_class(name)
        check_tier_keys(cls, {k: v for k, v in tier.items() if k not in VLLM_OWN_KEYS}, f"{page.name}[{index}]")


@pytest.mark.parametrize(("page", "text"), list(vllm_configs()))
def test_tiering_check_accepts_vllm_serve_configs(page, text, tmp_path, capsys, server_memory):
    """``tiering check`` on each ``--kv-transfer-config`` of the docs (binding keys such as model_revision included)."""
    config = json.loads(text)
    names = {t["type"].removeprefix("tiering_") for t in config["kv_connector_extra_config"]["secondary_tiers"]}
    if not names <= installed_types():
        pytest.skip(f"tiers {sorted(names - installed_types())} not installed here")
    path = tmp_path / "kv-transfer-config.json"
    path.write_text(text)
    assert tiering_main(["check", str(path)]) == 0, capsys.readouterr().err
    assert "config ok" in capsys.readouterr().out


def vllm_tier_entries():
    for page in PAGES:
        for body in blocks(page, "json"):
            entry = json.loads(body)
            if isinstance(entry, dict) and entry.get("module_path") == "tiering.core.vllm.tiers":
                yield pytest.param(page, entry, id=f"{page_id(page)}: {entry['type']}")


@pytest.mark.parametrize(("page", "entry"), list(vllm_tier_entries()))
def test_tiering_check_accepts_vllm_tier_entries(page, entry, tmp_path, capsys):
    """Each lone vLLM-form tier entry of the docs, inside a minimal config, passes ``tiering check``."""
    if entry["type"].removeprefix("tiering_") not in installed_types():
        pytest.skip(f"tier {entry['type']!r} not installed here")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 26, "secondary_tiers": [entry]}))
    assert tiering_main(["check", str(path)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "bash")], ids=page_id)
def test_bash_samples_name_existing_scripts_and_our_packages(page):
    for body in blocks(page, "bash"):
        for script in re.findall(r"(scripts/[\w./-]+)", body):
            assert (REPO / script).exists(), script
        for line in body.splitlines():
            if re.match(r"\s*(\.venv/bin/)?pip install", line):
                for dist in re.findall(r"\b(tiering-[a-z0-9]+)", line):
                    assert (REPO / "packages" / dist).is_dir(), dist
