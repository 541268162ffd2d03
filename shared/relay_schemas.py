"""Wire schemas of shardcast relays: where one serves, what the coordinator lists, and a client's report of one."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from intellect_protocol.shared.schemas import INT32_MAX, Address, Request


class RelayRegister(Request):
    """A shardcast server announcing where it serves (signed by its own key, which holds the relay role)."""

    address: Address
    url: Annotated[str, Field(max_length=512, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")]
    kind: Literal["relay", "origin"] = "relay"


class RelayInfo(BaseModel):
    address: Address
    url: str
    kind: Literal["relay", "origin"]
    last_seen: datetime


class RelayReportRequest(Request):
    """A client's report that a relay failed it or served a chunk whose hash did not match."""

    relay_url: Annotated[str, Field(max_length=512)]
    run_id: Annotated[str, Field(max_length=64)]
    step: int = Field(ge=0, le=INT32_MAX)
    chunk: int = Field(ge=0, le=INT32_MAX)
    reason: Literal["hash_mismatch", "unavailable"]
