"""Publishing a policy step from the trainer's side of the origin.

The trainer saves step N's model directory straight into the origin's data directory
(``DATA_DIR/RUN/N/``); :func:`publish_step` hashes it in place, writes the signed manifest
there last (the origin serves a step only once its manifest exists) and :func:`post_manifest`
registers it with the coordinator, which is when relays and nodes learn of it.
"""

from __future__ import annotations

from pathlib import Path

from eth_account.signers.local import LocalAccount

from shared.http import coordinator_client
from shared.shardcast.manifest import DEFAULT_CHUNK_SIZE, SignedManifest, build_manifest, sign_manifest
from shared.shardcast.store import MANIFEST_FILE, write_atomic
from shared.signing import SignedAuth


def step_dir(data_dir: Path, run_id: str, step: int) -> Path:
    """Where the trainer writes step ``step`` of ``run_id`` for the origin to serve."""
    return data_dir / run_id / str(step)


def publish_step(
    data_dir: Path, run_id: str, step: int, account: LocalAccount, *, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> SignedManifest:
    directory = step_dir(data_dir, run_id, step)
    signed = sign_manifest(build_manifest(directory, run_id, step, chunk_size=chunk_size), account)
    write_atomic(directory / MANIFEST_FILE, signed.model_dump_json().encode())
    return signed


def post_manifest(coordinator: str, account: LocalAccount, signed: SignedManifest, audience: str) -> dict:
    """Register the manifest with the coordinator (the account must hold the trainer role)."""
    with coordinator_client(coordinator.rstrip("/"), 30.0, SignedAuth(account, audience)) as http:
        reply = http.post("/v1/manifests", content=signed.model_dump_json(), headers={"content-type": "application/json"})
    if reply.status_code not in (200, 201):
        raise RuntimeError(f"the coordinator refused the manifest of step {signed.manifest.step}: {reply.status_code} {reply.text}")
    return reply.json()
