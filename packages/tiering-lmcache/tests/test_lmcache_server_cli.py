"""The docs' ``lmcache server`` command, run with our adapter, checked through LMCache's own HTTP API.

The command is read from docs/content/lmcache.md (the quick start's
``lmcache server ... --l2-adapter '{...}'``) and run as a separate process,
as a user runs it, with four changes: the ``lmcache`` of this environment
instead of ``.venv/bin/lmcache``; the tier's ``root`` a test directory
instead of ``/mnt/kv``; ``--l1-size-gb 1`` instead of 20 (this machine's
memory); free ports for the ZMQ and HTTP servers on 127.0.0.1. Before it
starts, three objects are stored in that root by our adapter, built with
LMCache's own factory from the same ``--l2-adapter`` JSON (as a previous
server would have left them).

Through the server's HTTP API the test checks that it runs (``/healthcheck``),
that its one L2 adapter is ours and healthy (``/status``: the store and
prefetch controllers each drive one active adapter, our
``report_status`` with no errors; ``/config/adapters``), that it counted
the objects left in the root under their cache salt (``/quota/<salt>``,
which sums ``get_usage().bytes_by_cache_salt`` over the L2 adapters), and
that SIGTERM stops it cleanly.

What needs a GPU and is not run here: an engine connected to the server
(vLLM's or SGLang's LMCache connector copying KV pages between its GPU and
LMCache's L1), so objects reaching our adapter from a live request; the
server's store and prefetch controllers moving objects between L1 and our
adapter are run on CPU in ``test_lmcache_server.py``. ``/cache/objects``
(listing an adapter's keys) answers that our adapter does not list: its
keys are digests of LMCache's ``ObjectKey``, which cannot be turned back
into one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache", reason="the lmcache environment: hatch run lmcache:test")

from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import get_l2_adapter_config_class

from tiering.core.units import parse_size
from tiering.lmcache.driver import memory_obj, object_key, store
from tiering.lmcache.keys import row_bytes

DOCS = Path(__file__).resolve().parents[3] / "docs" / "content" / "lmcache.md"
START_S = 60.0


def docs_server_command() -> list[str]:
    """The quick start's ``lmcache server`` command, as the shell would split it."""
    text = DOCS.read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        start = joined.find("lmcache server")
        if start >= 0:  # from the start of its line to the block's end (the JSON argument spans lines)
            return shlex.split(joined[joined.rfind("\n", 0, start) + 1 :])
    raise AssertionError(f"no `lmcache server` command in {DOCS}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def server_argv(root: Path, http_port: int) -> tuple[list[str], dict[str, Any]]:
    """The docs' command with the four changes of the module doc; also the ``--l2-adapter`` JSON it passes."""
    argv = docs_server_command()
    assert Path(argv[0]).name == "lmcache" and argv[1] == "server", argv
    argv[0] = str(Path(sys.executable).with_name("lmcache"))
    adapter = json.loads(argv[argv.index("--l2-adapter") + 1])
    assert adapter["adapter_params"]["tier"]["root"] == "/mnt/kv"
    adapter["adapter_params"]["tier"]["root"] = str(root)
    argv[argv.index("--l2-adapter") + 1] = json.dumps(adapter)
    argv[argv.index("--l1-size-gb") + 1] = "1"
    argv += ["--host", "127.0.0.1", "--port", str(free_port()), "--http-host", "127.0.0.1"]
    argv += ["--http-port", str(http_port)]
    return argv, adapter


def wait_healthy(process: subprocess.Popen[bytes], base: str, log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"lmcache server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if get_json(f"{base}/healthcheck") == {"status": "healthy"}:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"lmcache server not healthy within {START_S} s:\n{log.read_text()[-4000:]}")


def test_docs_lmcache_server_runs_our_adapter_as_its_healthy_l2(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    root.mkdir()
    http_port = free_port()
    argv, adapter_config = server_argv(root, http_port)
    object_bytes = parse_size(adapter_config["adapter_params"]["object_bytes"])
    # Objects a previous server left in the root: stored by our adapter, built by LMCache's factory.
    small = 4096  # the objects' bytes: every object costs one full row (row_bytes(object_bytes)) all the same
    # The same namespace (it depends on object_bytes only), with 4 staging rows instead of 64: 2 GiB less here.
    writer = {**adapter_config, "adapter_params": {**adapter_config["adapter_params"], "staging_objects": 4}}
    adapter = create_l2_adapter(get_l2_adapter_config_class("plugin").from_dict(writer))
    try:
        keys = [object_key(i, cache_salt="acme") for i in range(3)]
        assert store(adapter, keys, [memory_obj(os.urandom(small)) for _ in keys]).is_successful()
    finally:
        adapter.close()

    log = tmp_path / "server.log"
    env = {**os.environ, "LMCACHE_DISABLE_BANNER": "1"}
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    base = f"http://127.0.0.1:{http_port}"
    try:
        wait_healthy(process, base, log)
        status = get_json(f"{base}/status")
        assert status["is_healthy"] is True
        manager = status["storage_manager"]
        (ours,) = manager["l2_adapters"]
        assert ours["type"] == "TieringL2Adapter" and ours["tier"] == "fs"
        assert ours["is_healthy"] is True and ours["errors"] == 0
        assert ours["staging_bytes"] == 64 * row_bytes(object_bytes)  # the default 64 rows, faulted in at start
        for controller in (manager["store_controllers"]["_default"], manager["prefetch_controller"]):
            assert controller["is_healthy"] is True and controller["num_active_adapters"] == 1
        assert get_json(f"{base}/config/adapters")["adapters"] == [
            {"index": 0, "type_name": "plugin", "tier": "l2", "primary": True, "reconfigurable": False}
        ]
        # The objects in the root are counted under their salt once the adapter's start-up listing ran.
        deadline, used = time.monotonic() + START_S, 0
        while time.monotonic() < deadline:
            used = round(get_json(f"{base}/quota/acme")["current_usage_gb"] * 2**30)
            if used:
                break
            time.sleep(0.2)
        assert used == 3 * row_bytes(object_bytes)
        assert get_json(f"{base}/status")["storage_manager"]["l2_adapters"][0]["tier_stats"]["blocks_stored"] == 0
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=START_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    # LMCache closes its server, then ends by the signal it was sent (exit status -SIGTERM).
    assert code in (0, -signal.SIGTERM) and "MPCacheServer closed" in log.read_text(), log.read_text()[-4000:]
