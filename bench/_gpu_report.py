"""``bench/gpu.py``'s figures by part, printed as one table and written as JSON after every part."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

GOAL_PREFILL_OVER_GENERATION = 25.0


class Report:
    """Every figure, by part; printed as a table and written as JSON after each part."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out = out
        self.started = time.perf_counter()
        self.budget_s = budget_s
        self.parts: dict[str, dict[str, Any]] = {}

    def left(self, share: float) -> float:
        """Seconds until this run has spent ``share`` of its budget."""
        return share * self.budget_s - (time.perf_counter() - self.started)

    @contextmanager
    def part(self, name: str, fatal: bool = False) -> Iterator[dict[str, Any]]:
        """Figures of part ``name``; an error is recorded, and raised again only if the parts after it need this one."""
        figures: dict[str, Any] = {}
        self.parts[name] = figures
        begun = time.perf_counter()
        print(f"[{time.perf_counter() - self.started:6.1f} s] {name} ...", flush=True)
        try:
            yield figures
        except Exception as e:  # one part's failure must not cost the others' figures
            figures["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            if fatal:
                raise
        finally:
            figures["s"] = round(time.perf_counter() - begun, 2)
            self.save()

    def save(self) -> None:
        self.out.write_text(json.dumps(self.parts, indent=2, default=str))


def table(report: Report, title: str) -> str:
    p = report.parts
    honest, throughput, grpo, forged = (p.get(k, {}) for k in ("honest", "throughput", "grpo", "forgeries"))
    totals = honest.get("totals", {})
    lines = [title, f"{'check':58s} {'figure':>22s}  goal"]

    def row(name: str, figure: str, goal: str = "") -> None:
        lines.append(f"{name:58s} {figure:>22s}  {goal}")

    noise = p.get("noise", {})
    if "values" in noise:
        figure = f"{noise['differing']} of {noise['values']}, {noise['largest_difference']:.2g}"
        row("seeded noise: values unlike the CPU's, largest difference", figure, "0, or far below the check's")
    if "rows" in totals:
        row("honest rows rejected", f"{totals['rejected_rows']:.0f} of {totals['rows']:.0f}", "0 of >= 5,000")
        row("honest rows kept out of training (explained near-ties)", f"{totals['untrained_rows']:.0f}")
        for batch, figures in sorted(honest["by_node_batch"].items()):
            row(
                f"  node batch {batch}: rows rejected, generation tokens/s",
                f"{figures['rejected_rows']:.0f}/{figures['rows']:.0f}, {figures['tokens_per_s']:.0f}",
            )
        for config, figures in sorted(honest["by_validator"].items()):
            row(
                f"  validator batch/kernel {config}: rows rejected, tokens/s",
                f"{figures['rejected_rows']:.0f}/{figures['rows']:.0f}, {figures['tokens_per_s']:.0f}",
            )
        row("TOPLOC build, us per committed position (node CPU)", f"{totals['proof_build_us_per_position']:.1f}")
    by_batch = throughput.get("by_node_batch", {})
    if "proof_verify_us_per_position" in throughput:
        row("TOPLOC verify, us per committed position (validator CPU)", f"{throughput['proof_verify_us_per_position']:.1f}")
        for batch, figures in by_batch.items():
            row(f"validator prefill tokens/s, on node batch {batch}'s rows", f"{figures['prefill_tokens_per_s']:.0f}")
        row("validator whole check tokens/s", f"{totals.get('check_tokens_per_s', 0):.0f}")
    for name, figures in forged.items():
        if isinstance(figures, dict):
            figure = f"{figures['forged_rows_trained']} rows trained, {figures['accepted']}/{figures['files']} files accepted"
            cut = figures.get("cut_short") and not figures["files"]
            row(f"forged: {name}", "not run: out of time" if cut else figure, "0 rows trained")
    if "step_s" in grpo:
        row(f"GRPO step, {grpo['rows']} rows (fp32 AdamW), s", f"{grpo['step_s']:.3f}")
    errors = [f"{name}: {figures['error']}" for name, figures in p.items() if "error" in figures]
    lines += [f"error in {e}" for e in errors]
    for batch, figures in by_batch.items():
        row(
            f"validator prefill / node generation, tokens/s, batch {batch}",
            f"{figures['prefill_over_generation']:.1f}x",
            f">= {GOAL_PREFILL_OVER_GENERATION:.0f}x",
        )
    return "\n".join(lines)
