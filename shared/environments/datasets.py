"""Environment datasets from local JSONL or Parquet files: one problem per row, with an ``id``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parent / "samples"
"""Small sample sets we wrote, shipped for the math and code environments."""


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names the file and the row."""


def load_rows(path: Path, required: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl`` or ``.parquet`` file, each checked for ``required`` fields and a unique id."""
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{number}: not JSON ({e.msg})") from None
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    else:
        raise DatasetError(f"{path}: datasets are .jsonl or .parquet files")
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        missing = [field for field in ("id", *required) if not isinstance(row, dict) or row.get(field) in (None, "")]
        if missing:
            raise DatasetError(f"{path}: row {number} lacks {', '.join(missing)}")
        row["id"] = str(row["id"])
        if row["id"] in seen:
            raise DatasetError(f"{path}: row {number} repeats id {row['id']}")
        seen.add(row["id"])
    return rows
