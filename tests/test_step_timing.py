"""Step timing against a real coordinator, validator and trainer: each policy step's wall clock is
split by the coordinator's own timestamps into the node's time, the upload, validation, the trainer
waiting and the trainer working, published at /v1/public/runs/{id}/step-timing and in Prometheus."""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from eth_account import Account
from rich.console import Console
from sqlalchemy import func, select

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import ContributionEntry, Submission, Task, TrainerMetrics
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.states import SubmissionStatus
from intellect_protocol.trainer.loop import Trainer
from intellect_protocol.trainer.settings import TrainerSettings
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, admin_token, serve
from tests.helpers import HTTP, make_run
from tests.support.protocol import grant, joined, lease, upload

HOLD_S = 0.5
"""How long the node keeps each task between its lease and its upload."""
QUEUE_S = 1.5
"""How long the uploads wait before a validator starts."""


def test_a_steps_wall_clock_is_split_by_the_coordinators_timestamps(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
    )
    with serve(settings) as served:
        run_id = make_run(served, sampling=SamplingParams(temperature=1.0, max_tokens=48), prompts=2, samples=4)
        token = admin_token(served)
        trainer_key, validator_key = Account.create(), Account.create()
        grant(served, token, trainer_key.address, "trainer")
        grant(served, token, validator_key.address, "validator")
        node = joined(served)
        uploads: list[float] = []  # each upload's wall clock, as this client saw it
        for _ in range(8):  # 16 groups: enough for 3 with reward variance (measured in tests/test_trainer.py)
            task = lease(served, node)
            data = finish(generate(task)).data
            time.sleep(HOLD_S)
            started = time.monotonic()
            upload(served, node, task, data)
            uploads.append(time.monotonic() - started)
        time.sleep(QUEUE_S)
        validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True), batch=8)
        assert validator.run(max_submissions=8) == 8
        validator.close()
        trainer = Trainer(
            served.url, trainer_key, run_id, tmp_path / "origin", tmp_path / "ckpt", TrainerSettings(groups_per_step=3)
        )
        assert trainer.run(threading.Event(), steps=1) == 1
        trainer.close()

        timings = HTTP.get(f"{served.url}/v1/public/runs/{run_id}/step-timing").json()
        assert [t["step"] for t in timings] == [1]
        (timing,) = timings
        with make_sessionmaker(served.engine)() as session:
            read = session.scalar(
                select(func.count()).where(ContributionEntry.kind == "credit", ContributionEntry.id <= trainer.state.cursor)
            )
        assert 1 <= timing["submissions"] == read < 8  # what the step read, not everything accepted
        assert HOLD_S <= timing["node_s"] < 30
        # The coordinator's view of an upload lies within the client's, and holds none of the node's time.
        assert 0 <= timing["upload_s"] <= max(uploads)
        assert timing["validation_s"] >= QUEUE_S
        # The trainer's clock starts at the run's first lease: it waited for everything above.
        assert timing["trainer_wait_s"] >= 8 * HOLD_S + QUEUE_S
        assert timing["training_s"] > 0
        assert abs(timing["trainer_wait_s"] + timing["training_s"] - timing["interval_s"]) < 1e-6
        assert timing["expired"] == 0 and timing["dropped_stale"] == 0

        exported = HTTP.get(f"{served.url}/metrics").text
        for phase in ("node", "upload", "validation", "trainer_wait", "training", "interval"):
            line = re.search(rf'intellect_policy_step_seconds\{{phase="{phase}",run="{run_id}"\}} (\S+)', exported)
            assert line is not None, phase
            assert abs(float(line.group(1)) - timing[f"{phase}_s"]) < 1e-6
        assert f'intellect_policy_step{{run="{run_id}"}} 1.0' in exported

        assert HTTP.get(f"{served.url}/v1/public/runs/run-nope/step-timing").status_code == 404
        assert HTTP.get(f"{served.url}/v1/public/runs/{run_id}/step-timing?limit=0").status_code == 422


def test_each_step_reads_its_own_cursor_range_and_the_newest_steps_come_alone(coordinator) -> None:
    """A ledger laid out by hand, second by second: two steps, each reading two submissions, and one
    submission expiring during step 2; every phase is known exactly."""
    run_id = make_run(coordinator)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    # (leased, upload started, recorded, accepted) per submission, in acceptance order.
    work = [(0, 2, 2.5, 4), (1, 3, 3.5, 5), (6, 8, 8.25, 9), (7, 9, 9.25, 11)]
    with make_sessionmaker(coordinator.engine).begin() as session:
        for i, (leased, started, recorded, accepted) in enumerate(work):
            _submission(session, run_id, f"s{i}", at(leased), at(started), at(recorded), SubmissionStatus.accepted)
            session.flush()
            session.add(
                ContributionEntry(
                    address="0x" + "1" * 40,
                    submission_id=f"sub-s{i}",
                    kind="credit",
                    units=1_000_000,
                    reason="",
                    created_at=at(accepted),
                    final_at=at(accepted),
                )
            )
        _submission(session, run_id, "late", at(5), at(6), at(6), SubmissionStatus.expired, validated_at=at(10))
        session.flush()
        ids = list(session.scalars(select(ContributionEntry.id).order_by(ContributionEntry.id)))
        for step, published, cursor in ((1, 5.5, ids[1]), (2, 13, ids[3])):
            session.add(
                PolicyManifest(
                    run_id=run_id,
                    step=step,
                    signer="0x" + "2" * 40,
                    digest="0" * 64,
                    total_bytes=1,
                    body="{}",
                    created_at=at(published),
                )
            )
            session.add(
                TrainerMetrics(
                    run_id=run_id, step=step, metrics={"dropped_stale": float(step)}, created_at=at(published), cursor=cursor
                )
            )

    first, second = HTTP.get(f"{coordinator.url}/v1/public/runs/{run_id}/step-timing").json()
    assert first == {
        "step": 1,
        "interval_s": 5.5,
        "node_s": 2.0,
        "upload_s": 0.5,
        "validation_s": 1.5,
        "trainer_wait_s": 5.0,
        "training_s": 0.5,
        "submissions": 2,
        "expired": 0,
        "expired_tokens": 0,
        "dropped_stale": 1.0,
    }
    assert second == {
        "step": 2,
        "interval_s": 7.5,
        "node_s": 2.0,
        "upload_s": 0.25,
        "validation_s": 1.25,
        "trainer_wait_s": 5.5,
        "training_s": 2.0,
        "submissions": 2,
        "expired": 1,
        "expired_tokens": 7,
        "dropped_stale": 2.0,
    }
    assert HTTP.get(f"{coordinator.url}/v1/public/runs/{run_id}/step-timing?limit=1").json() == [second]


def _submission(
    session,
    run_id: str,
    name: str,
    leased: datetime,
    started: datetime,
    recorded: datetime,
    status: str,
    validated_at: datetime | None = None,
) -> None:
    session.add(
        Task(
            id=f"task-{name}",
            run_id=run_id,
            prompt_ids={"ids": []},
            seed=1,
            policy_step=0,
            status="submitted",
            created_at=leased,
            leased_at=leased,
        )
    )
    session.flush()  # no ORM relationship orders the two inserts
    session.add(
        Submission(
            id=f"sub-{name}",
            task_id=f"task-{name}",
            run_id=run_id,
            address="0x" + "1" * 40,
            sha256="0" * 64,
            blob_key=name,
            rows=1,
            tokens=7,
            status=status,
            created_at=recorded,
            upload_started_at=started,
            validated_at=validated_at,
        )
    )
