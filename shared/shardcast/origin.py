"""Publishing a policy step from the trainer's side of the origin.

The trainer saves step N's model directory straight into the origin's data directory
(``DATA_DIR/RUN/N/``); :func:`publish_step` hashes it in place, writes the signed manifest
there last (the origin serves a step only once its manifest exists); posting it to the
coordinator (:meth:`CoordinatorClient.publish_manifest`) is when relays and nodes learn of it.
"""

from __future__ import annotations

from pathlib import Path

from eth_account.signers.local import LocalAccount

from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.files import write_atomic
from intellect_protocol.shared.shardcast.chunking import DEFAULT_CHUNK_SIZE
from intellect_protocol.shared.shardcast.manifest import SignedManifest, build_manifest, sign_manifest
from intellect_protocol.shared.shardcast.store import MANIFEST_FILE


def step_dir(data_dir: Path, run_id: str, step: int) -> Path:
    """Where the trainer writes step ``step`` of ``run_id`` for the origin to serve."""
    return data_dir / run_id / str(step)


@spent("publishing")
def publish_step(
    data_dir: Path, run_id: str, step: int, account: LocalAccount, *, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> SignedManifest:
    directory = step_dir(data_dir, run_id, step)
    signed = sign_manifest(build_manifest(directory, run_id, step, chunk_size=chunk_size), account)
    write_atomic(directory / MANIFEST_FILE, signed.model_dump_json().encode())
    return signed
