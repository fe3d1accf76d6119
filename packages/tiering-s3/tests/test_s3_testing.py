"""tiering.s3.testing: importable without moto or pytest (neither is a dependency of tiering-s3)."""

import socket
import subprocess
import sys

import pytest

IMPORT_WITHOUT = """
import sys
sys.modules["moto"] = sys.modules["pytest"] = None  # any import of them now raises ImportError
import tiering.s3.testing as testing
assert callable(testing.moto_server) and callable(testing.nanio_server)
"""


def test_testing_module_imports_without_moto_or_pytest():
    run = subprocess.run([sys.executable, "-c", IMPORT_WITHOUT], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]


def test_moto_server_in_a_child_process_serves_its_bucket_and_resets():
    from tiering.s3.testing import moto_server

    with moto_server("child-bucket", process=True) as server:
        client = server.client()
        client.put_object(Bucket="child-bucket", Key="k", Body=b"v")
        server.reset()  # every object goes, the bucket is made again
        assert client.list_objects_v2(Bucket="child-bucket").get("KeyCount") == 0
        endpoint = server.endpoint_url
    with pytest.raises(OSError):  # stopped on exit
        socket.create_connection(server.host_port, timeout=1).close()
    assert server.connection() == {
        "bucket": "child-bucket",
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": server.access_key,
        "aws_secret_access_key": server.secret_key,
    }
