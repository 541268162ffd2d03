"""The distribution's version (from git, through setuptools-scm) and the protocol version the roles must share."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("intellect-protocol")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

PROTOCOL_VERSION = 4
"""The version of what two roles must compute or read alike: the wire schemas, the rollout file, the seeded
sampler, TOPLOC and the validator's checks. Bump it with any change to one of them. The coordinator refuses
every signed request of another protocol (:func:`protocol_mismatch`), so no run mixes work of two. Version 1
is every release before the number was sent (it sends none); 3 computes the sampler's noise in float64, so a
GPU's is a CPU's to within one float32 step; 4 draws the validator that judges an island audit (a run's
pretraining settings gain ``audit_second_opinion`` and ``audit_replay_s``, which a version-3 role would refuse)."""

PROTOCOL_HEADER = "x-intellect-protocol"
"""The request header that carries the sender's :data:`PROTOCOL_VERSION`, sent with every signed request."""


def sent_protocol(header: str | None) -> int | None:
    """The protocol a request's :data:`PROTOCOL_HEADER` names: 1 when absent, None when it is not a number."""
    if header is None:
        return 1
    return int(header) if header.isascii() and header.isdigit() and len(header) <= 6 else None


def protocol_mismatch(client: int, coordinator: int) -> str | None:
    """The sentence that refuses a client of protocol ``client`` at a coordinator of ``coordinator``, saying
    which side must upgrade; None when they match."""
    if client == coordinator:
        return None
    if client < coordinator:
        return (
            f"This client speaks protocol {client} and the coordinator protocol {coordinator}: "
            "upgrade the client (pip install -U intellect-protocol)."
        )
    return (
        f"This client speaks protocol {client} but the coordinator only protocol {coordinator}: the coordinator "
        f"must upgrade first; until it does, run a client release that speaks protocol {coordinator}."
    )
