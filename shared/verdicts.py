"""A validator's verdict as signed text, so anyone holding a receipt can check who judged what.

The text binds the deployment's audience, the submission, the sha256 of the judged file, every
check's outcome and the rows kept out of training; the signature is EIP-191 by the validator's
key. The coordinator refuses a verdict whose signature is not the signer's over exactly these,
and every receipt carries it (``/v1/public/submissions/{id}``).
"""

from __future__ import annotations

import json

from eth_account.signers.local import LocalAccount

from intellect_protocol.shared.schemas import CheckOutcome
from intellect_protocol.shared.signing import recover_text_signer, sign_text


def verdict_text(audience: str, submission_id: str, sha256: str, checks: list[CheckOutcome], untrained_rows: list[int]) -> str:
    payload = {
        "audience": audience,
        "submission_id": submission_id,
        "sha256": sha256,
        "checks": [c.model_dump() for c in checks],
        "untrained_rows": sorted(set(untrained_rows)),
    }
    return "intellect-verdict:" + json.dumps(payload, sort_keys=True, separators=(",", ":"))


def sign_verdict(
    account: LocalAccount, audience: str, submission_id: str, sha256: str, checks: list[CheckOutcome], untrained_rows: list[int]
) -> str:
    return sign_text(account, verdict_text(audience, submission_id, sha256, checks, untrained_rows))


def verdict_signer(
    signature: str, audience: str, submission_id: str, sha256: str, checks: list[CheckOutcome], untrained_rows: list[int]
) -> str:
    """The address that signed this verdict; ``ValueError`` for a signature that recovers none."""
    return recover_text_signer(verdict_text(audience, submission_id, sha256, checks, untrained_rows), signature)
