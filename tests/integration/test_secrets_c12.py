"""Case C12 (issue 13, kind 7), the command side: no credential reaches any output of any ``tiering`` command.

An S3 tier is configured with explicit ``aws_access_key_id`` /
``aws_secret_access_key`` against a moto server; every command (and every
failing config) runs through the installed console script, and its stdout,
stderr and written files are scanned for both values.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tiering.s3")
pytest.importorskip("moto")
if os.environ.get("TIERING_IT_BACKENDS", "s3") != "s3":
    pytest.skip("run once per Python, in the s3 environment of the matrix", allow_module_level=True)

EXE = Path(sys.executable).parent / "tiering"
ACCESS_KEY_ID = "AKIAC12ACCESSKEYID77"
SECRET = "c12-SecretValue-9f3a7ZqW"
BUCKET = "tiering-c12"


@pytest.fixture(scope="module")
def endpoint():
    from tiering.s3.testing import moto_server

    with moto_server(BUCKET) as server:
        yield server.endpoint_url


def s3_entry(endpoint, **extra):
    return {
        "type": "s3",
        "bucket": BUCKET,
        "prefix": "c12",
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": ACCESS_KEY_ID,
        "aws_secret_access_key": SECRET,
        **extra,
    }


def write_config(path, entry):
    config = {"cpu_bytes_to_use": 64 * 4096, "block_bytes": 4096, "block_size": 512, "secondary_tiers": [entry]}
    path.write_text(json.dumps(config))
    return path


def scan(outputs):
    for where, text in outputs:
        assert SECRET not in text, f"the secret access key reached {where}:\n{text[-3000:]}"
        assert ACCESS_KEY_ID not in text, f"the access key id reached {where}:\n{text[-3000:]}"


def run(*args, env=None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run(
        [str(EXE), *map(str, args)], capture_output=True, text=True, timeout=300, env={**environ, **(env or {})}
    )
    return proc


def test_C12_no_command_output_holds_a_credential(endpoint, tmp_path):
    config = write_config(tmp_path / "s3.json", s3_entry(endpoint))
    report = tmp_path / "report.json"
    commands = [
        ("check", config),
        ("check", config, "--probe"),
        ("-v", "bench", "--config", config, "--requests", "40", "--json", report),
        ("stat", config),
        ("stat", config, "--json"),
        ("ls", config),
        ("ls", config, "--json"),
        ("verify", config),
        ("gc", config, "--older-than", "3650d", "--dry-run"),
        (
            "ls",
            "--tier",
            "s3",
            "--bucket",
            BUCKET,
            "--prefix",
            "c12",
            "--endpoint-url",
            endpoint,
            "--region-name",
            "us-east-1",
            "--aws-access-key-id",
            ACCESS_KEY_ID,
            "--aws-secret-access-key",
            SECRET,
        ),
    ]
    outputs = []
    for args in commands:
        proc = run(*args)
        label = "tiering " + " ".join(map(str, args))
        assert proc.returncode == 0, f"{label}: {proc.stderr}"
        outputs += [(f"{label} stdout", proc.stdout), (f"{label} stderr", proc.stderr)]
    data = json.loads(report.read_text())
    assert data["requests"] == 40 and data["config"]["secondary_tiers"][0]["aws_secret_access_key"] == "***"
    outputs.append(("bench --json file", report.read_text()))
    scan(outputs)


@pytest.mark.parametrize(
    "extra",
    [
        {"endpoint_url": "http://127.0.0.1:9"},  # nothing listens: the probe fails
        {"endpoint_url": f"http://user:{SECRET}@127.0.0.1:9"},  # a password inside a URL
        {"aws_secret_access_key": 12345678},  # a wrong type under a secret key
    ],
    ids=["unreachable", "url-password", "secret-type"],
)
def test_C12_failing_configs_name_no_credential(endpoint, tmp_path, extra):
    config = write_config(tmp_path / "bad.json", s3_entry(endpoint, **extra))
    outputs = []
    failed = 0
    for args in (("check", config), ("check", config, "--probe"), ("-v", "stat", config)):
        proc = run(*args)
        failed += proc.returncode != 0
        label = "tiering " + " ".join(map(str, args))
        outputs += [(f"{label} stdout", proc.stdout), (f"{label} stderr", proc.stderr)]
    assert failed, "every command accepted a broken config"
    scan(outputs)
    if extra.get("aws_secret_access_key") == 12345678:
        assert all("12345678" not in text for _, text in outputs)
