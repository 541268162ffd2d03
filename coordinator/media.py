"""Which request bodies are JSON: the rule FastAPI applies when it parses a body, applied by our guards too.

Media types are case-insensitive and may carry a structured suffix and parameters
(``Application/Merge-Patch+JSON; charset=utf-8``), and FastAPI parses a body with no content
type as JSON as well. A guard that matched only ``application/json`` would let a body past it
that the handler still reads as JSON.
"""

from __future__ import annotations


def is_json(content_type: str | bytes | None) -> bool:
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    if not content_type or not content_type.strip():
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))
