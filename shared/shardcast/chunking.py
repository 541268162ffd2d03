"""How a step's files are cut and named, without the manifest's signing: importable by wire schemas that
must not load a wallet library (the coordinator's commands do not)."""

from typing import Annotated

from pydantic import Field

DEFAULT_CHUNK_SIZE = 32 * 2**20
Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
"""A blake3 or sha256 digest in hex."""
