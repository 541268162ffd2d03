"""The S3-compatible blob store against a real S3 server on loopback (moto's): uploads land in the
bucket and validators read them back; while the service is down an upload is answered 503 and
nothing is recorded, and the node's retry succeeds once it is back."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest
from eth_account import Account
from rich.console import Console

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.processes import free_port
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, admin_token, serve
from tests.helpers import HTTP, make_run, signed_post
from tests.support.protocol import grant, joined, lease

if TYPE_CHECKING:
    from moto.server import ThreadedMotoServer

BUCKET = "rollouts"


class S3:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server: ThreadedMotoServer | None = None

    def start(self) -> None:
        """The service, holding the bucket (moto keeps objects in this process's memory, across restarts)."""
        # Imported here: moto brings Flask, whose context proxies break vLLM's scan of every loaded module
        # when an engine starts in a test process that merely collected this module.
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.client().create_bucket(Bucket=BUCKET)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server: ThreadedMotoServer | None = None

    def client(self):
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    service = S3()
    service.start()
    try:
        yield service
    finally:
        service.stop()


def _settings(sqlite_url: str, s3: S3) -> CoordinatorSettings:
    return CoordinatorSettings(
        database_url=sqlite_url,
        blob_store="s3",
        s3_bucket=BUCKET,
        s3_prefix="devnet",
        s3_endpoint_url=s3.endpoint,
        s3_region="us-east-1",
        **LIFTED,
    )


def test_uploads_land_in_the_bucket_and_validators_read_them(sqlite_url: str, s3: S3, tmp_path: Path) -> None:
    with serve(_settings(sqlite_url, s3)) as served:
        make_run(served, sampling=SamplingParams(max_tokens=16), prompts=1, samples=2)
        node = joined(served)
        task = lease(served, node)
        data = finish(generate(task)).data
        reply = signed_post(served.url, "/v1/submissions", node, served.audience, data, query=f"task={task.task_id}")
        assert reply.status_code == 200, reply.text
        submission_id = reply.json()["submission_id"]

        [stored] = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"devnet/{task.run_id}/")["Contents"]
        assert stored["Key"].startswith(f"devnet/{task.run_id}/{task.task_id}/")
        assert s3.client().get_object(Bucket=BUCKET, Key=stored["Key"])["Body"].read() == data

        validator_key = Account.create()
        grant(served, admin_token(served), validator_key.address, "validator")
        validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True))
        try:
            assert validator.run(max_submissions=1) == 1  # it read the file back from the bucket, streamed
        finally:
            validator.close()
        assert HTTP.get(f"{served.url}/v1/public/submissions/{submission_id}").json()["status"] == "accepted"


def test_an_outage_is_answered_503_and_records_nothing(
    sqlite_url: str, s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store stages under the system's temporary directory, which other test workers' coordinators share.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with serve(_settings(sqlite_url, s3)) as served:
        make_run(served, sampling=SamplingParams(max_tokens=16), prompts=1, samples=2)
        node = joined(served)
        task = lease(served, node)
        data = finish(generate(task)).data
        s3.stop()
        staging = tmp_path / "intellect-uploads"
        staged_before, before = set(staging.glob("*")), served.snapshot()
        reply = signed_post(served.url, "/v1/submissions", node, served.audience, data, query=f"task={task.task_id}")
        assert reply.status_code == 503 and reply.json()["code"] == "storage_unavailable", reply.text
        assert reply.headers["retry-after"]
        assert served.snapshot() == before
        assert set(staging.glob("*")) == staged_before  # the staged upload was removed

        s3.start()  # back: the node's next attempt is stored and recorded
        reply = signed_post(served.url, "/v1/submissions", node, served.audience, data, query=f"task={task.task_id}")
        assert reply.status_code == 200, reply.text
        assert len(s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"devnet/{task.run_id}/")["Contents"]) == 1
