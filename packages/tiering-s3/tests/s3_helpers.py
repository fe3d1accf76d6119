"""Store/load helpers of the s3 tier tests (imported by the test modules; conftest puts this folder on sys.path)."""

import itertools
import time

from tiering.core import JobMetadata, ReqContext, create_secondary_tier
from tiering.core.base import block_view
from tiering.core.format import HEADER_SIZE
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.testing import block_payload, wait_for_jobs

BLOCK = 16 * 1024
OBJ = BLOCK + HEADER_SIZE
CTX = ReqContext("test")
_ids = itertools.count(1)


def make_spec(block_bytes=BLOCK, num_blocks=16, **fields):
    return OffloadingSpec(
        {"cpu_bytes_to_use": num_blocks * block_bytes, "block_bytes": block_bytes, "model": "test/model", **fields}
    )


def build(config, spec=None, view=None):
    spec = spec or make_spec()
    view = view if view is not None else allocate_host_buffer(spec.num_primary_blocks, spec.block_bytes)
    return create_secondary_tier(config, view, spec), view


def store(tier, view, keys, slots=None, timeout_s=30.0):
    slots = list(slots if slots is not None else range(len(keys)))
    for key, slot in zip(keys, slots):
        block_view(view, slot)[:] = block_payload(key, view.shape[1])
    job = JobMetadata(next(_ids), keys, slots, False, CTX)
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], timeout_s)[job.job_id]


def load(tier, view, keys, slots=None, timeout_s=30.0):
    slots = list(slots if slots is not None else range(len(keys)))
    for slot in slots:
        block_view(view, slot)[:] = bytes(view.shape[1])
    job = JobMetadata(next(_ids), keys, slots, True, CTX)
    tier.submit_load(job)
    ok = wait_for_jobs(tier, [job.job_id], timeout_s)[job.job_id]
    if ok:
        for key, slot in zip(keys, slots):
            assert block_view(view, slot).tobytes() == block_payload(key, view.shape[1])
    return ok


def wait_until(predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def block_keys(env, prefix):
    return [k for k in env.list_keys(prefix) if not k.endswith("namespace.json")]
