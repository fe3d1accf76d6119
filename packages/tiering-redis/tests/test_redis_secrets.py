"""Case C12 for the redis tier: no password (keyword, inside ``url``, or the sentinels') reaches any command output."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tiering.redis.testing import LocalRedis

EXE = Path(sys.executable).parent / "tiering"
PASSWORD = "c12-RedisPass-7Qz9"


@pytest.fixture(scope="module")
def server():
    with LocalRedis(password=PASSWORD) as server:
        yield server


def write_config(path, entry):
    path.write_text(json.dumps({"cpu_bytes_to_use": 64 * 4096, "block_bytes": 4096, "block_size": 512,
                                "secondary_tiers": [entry]}))  # fmt: skip
    return path


def run(*args):
    return subprocess.run([str(EXE), *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("where", ["keyword", "url"])
def test_C12_no_command_output_holds_the_redis_password(server, tmp_path, where):
    entry = {"type": "redis", "prefix": f"c12-{where}"}
    if where == "url":
        entry["url"] = f"redis://default:{PASSWORD}@127.0.0.1:{server.port}/0"
    else:
        entry.update(url=server.url, password=PASSWORD)
    config = write_config(tmp_path / "redis.json", entry)
    report = tmp_path / "report.json"
    commands = [
        ("check", config, "--probe"),
        ("-v", "bench", "--config", config, "--requests", "40", "--json", report),
        ("-v", "stat", config),
        ("ls", config, "--json"),
    ]
    if where == "url":  # the rest once: they print what the commands above print
        commands += [("check", config), ("stat", config, "--json"), ("ls", config), ("verify", config)]
        commands += [("gc", config, "--older-than", "3650d", "--dry-run")]
    outputs = []
    for args in commands:
        proc = run(*args)
        label = "tiering " + " ".join(map(str, args))
        assert proc.returncode == 0, f"{label}: {proc.stderr}"
        outputs += [(f"{label} stdout", proc.stdout), (f"{label} stderr", proc.stderr)]
    outputs.append(("bench --json file", report.read_text()))
    for label, text in outputs:
        assert PASSWORD not in text, f"the password reached {label}:\n{text[-2000:]}"


@pytest.mark.parametrize(
    "entry",
    [
        {"url": f"redis://:{PASSWORD}@127.0.0.1:9/0"},  # nothing listens
        {"url": "redis://127.0.0.1:9/0", "password": PASSWORD},
        {"password": 12345678},  # a wrong type under a secret key
        {"mode": "sentinel", "sentinels": [["127.0.0.1", 9]], "service_name": "m", "sentinel_password": PASSWORD},
    ],
    ids=["url-password", "keyword", "secret-type", "sentinel"],
)
def test_C12_failing_redis_configs_name_no_password(tmp_path, entry):
    config = write_config(tmp_path / "bad.json", {"type": "redis", "retries": 0, **entry})
    proc = run("-v", "check", config, "--probe")
    assert proc.returncode != 0
    assert PASSWORD not in proc.stdout + proc.stderr and "12345678" not in proc.stdout + proc.stderr
