"""The node's session on disk, written atomically so a crash never leaves half a file."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ValidationError

from intellect_protocol.shared.files import write_atomic

STATE_FILE = "session.json"


class NodeSession(BaseModel):
    coordinator: str
    audience: str
    address: str
    registered_at: str | None = None
    last_status: str | None = None
    last_heartbeat_at: float | None = None


def load_session(state_dir: Path) -> NodeSession | None:
    """The saved session, or None when there is none or it cannot be read (it is rebuilt)."""
    try:
        return NodeSession.model_validate_json((state_dir / STATE_FILE).read_text())
    except (FileNotFoundError, ValidationError, ValueError, OSError):
        return None


def save_session(state_dir: Path, session: NodeSession) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(state_dir / STATE_FILE, json.dumps(session.model_dump(), indent=2).encode())
