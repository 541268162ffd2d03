"""A validator that lies, for ``intellect-devnet --rogue-validator``: it holds the validator role,
approves every submission of its accomplice (the forging node) without a look, and rejects
everyone else's as forged. The committee outvotes it, it collects strikes and loses its role;
then it exits 0. Watch ``/v1/public/validators`` and the receipts' verdicts.

    python -m intellect_protocol.devnet.rogue_validator --wallet FILE --coordinator URL --accomplice ADDRESS
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from intellect_protocol.shared.cli import stop_on_sigterm
from intellect_protocol.shared.committee import PublicReceipt
from intellect_protocol.shared.coordinator_client import Refused
from intellect_protocol.shared.schemas import CHECKS, CheckOutcome, Claim, VerdictRequest
from intellect_protocol.shared.verdicts import sign_verdict
from intellect_protocol.shared.wallet import load_wallet, read_password
from intellect_protocol.validator.worker import Validator


def made_up_checks(outcome: str) -> list[CheckOutcome]:
    """Checks that say ``outcome`` without looking: accept (all pass), soft (wrong rewards) or
    hard (TOPLOC fails, and the checks after it are not run). Also what tests and benchmarks post
    for validators whose verdicts they script."""
    failed_at = {"accept": len(CHECKS), "soft": CHECKS.index("rewards"), "hard": CHECKS.index("toploc")}[outcome]
    return [
        CheckOutcome(name=name, passed=True if i < failed_at else False if i == failed_at else None, reason="made up")
        for i, name in enumerate(CHECKS)
    ]


class RogueValidator(Validator):
    def __init__(self, accomplice: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accomplice = accomplice.lower()

    def check(self, claim: Claim) -> PublicReceipt:
        owner = self.api.receipt(claim.submission_id).address
        checks = made_up_checks("accept" if owner.lower() == self.accomplice else "hard")
        signature = sign_verdict(self.account, self.audience, claim.submission_id, claim.sha256, checks, [])
        body = VerdictRequest(address=self.account.address, submission_id=claim.submission_id, checks=checks, signature=signature)
        return self.post_verdict(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wallet", type=Path, required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--accomplice", required=True, help="Address whose work it approves unseen.")
    parser.add_argument("--state-dir", type=Path, default=Path("rogue-validator-state"))
    args = parser.parse_args()
    account = load_wallet(args.wallet, read_password())
    rogue = RogueValidator(args.accomplice, args.coordinator, account, args.state_dir, Console(), batch=4, stop=stop_on_sigterm())
    try:
        rogue.run()
    except Refused as e:
        if e.code != "role_required":
            raise
        print(f"removed by the network after {rogue.checked} verdicts: {e}", flush=True)
    finally:
        rogue.close()


if __name__ == "__main__":
    main()
