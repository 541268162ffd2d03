"""``intellect-trainer``: learn from validated rollouts and publish every policy step."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from intellect_protocol.shared.cli import CaFileOption, WalletOption, entry_point, exit_now, stop_on_sigterm, unlock
from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused, Stopped
from intellect_protocol.shared.environments.registry import EnvironmentUnavailable
from intellect_protocol.shared.states import RunKind

app = typer.Typer(help="Run the GRPO trainer of one run (the address needs the trainer role).", no_args_is_help=True)
console = Console()
err = Console(stderr=True)


@app.callback()
def main() -> None:
    """Run the GRPO trainer of one run (the address needs the trainer role)."""


@app.command()
def run(
    wallet_file: WalletOption,
    run_id: Annotated[str, typer.Option("--run", help="The run to train.")],
    origin_dir: Annotated[Path, typer.Option(help="The shardcast origin's data directory: steps are written there.")],
    coordinator: Annotated[str, typer.Option(help="Coordinator URL.")] = "http://127.0.0.1:8000",
    ca_file: CaFileOption = None,
    checkpoint_dir: Annotated[
        Path | None, typer.Option(help="Trainer state (step, cursor, optimizer); default ORIGIN_DIR/../trainer.")
    ] = None,
    steps: Annotated[int, typer.Option(min=0, help="Stop after publishing this policy step; 0: run until Ctrl-C.")] = 0,
    island: Annotated[
        str | None,
        typer.Option(
            help="Train as this island among several (a name unique in the run): on its own share of accepted "
            "rollouts, meeting the others for a DiLoCo outer step every sync_every inner steps (needs --lighthouse)."
        ),
    ] = None,
    lighthouse: Annotated[
        str | None, typer.Option(help="The islands' lighthouse URL, as `intellect-trainer lighthouse` prints it.")
    ] = None,
    advertise_host: Annotated[
        str, typer.Option(help="Where the other islands reach this one (its recovery server); an island's host name or IP.")
    ] = "127.0.0.1",
) -> None:
    """Pull accepted rollouts, take GRPO steps, publish each policy step through shardcast, until Ctrl-C."""
    if (island is None) != (lighthouse is None):
        err.print("--island and --lighthouse go together: an island meets the others through the lighthouse.", style="red")
        raise typer.Exit(2)
    from intellect_protocol.trainer.island_loop import IslandTrainer  # torch loads only for the command that needs it
    from intellect_protocol.trainer.loop import Trainer
    from intellect_protocol.trainer.pretrain_island import PretrainIsland

    account = unlock(wallet_file, err)
    stop = stop_on_sigterm()
    checkpoints = checkpoint_dir or origin_dir.parent / (f"island-{island}" if island else "trainer")
    try:
        with CoordinatorClient(coordinator, account, stop=stop) as api:
            pretraining = api.run_info(run_id).kind == RunKind.pretrain
        if pretraining and island is None:
            err.print("A pretraining run is learnt by trainer islands: pass --island NAME --lighthouse URL.", style="red")
            raise typer.Exit(2)
        if island is not None and lighthouse is not None:
            kind = PretrainIsland if pretraining else IslandTrainer
            trainer: Trainer = kind(
                coordinator, account, run_id, island, lighthouse, origin_dir, checkpoints, stop=stop, host=advertise_host
            )
        else:
            trainer = Trainer(coordinator, account, run_id, origin_dir, checkpoints, stop=stop)
    except (Stopped, KeyboardInterrupt):
        raise typer.Exit(0) from None
    except Refused as e:
        err.print(f"Cannot start: the coordinator refused ({e}).", style="red", markup=False)
        raise typer.Exit(5) from None
    except EnvironmentUnavailable as e:
        err.print(f"Cannot train this run: {e}.", style="red", markup=False)
        raise typer.Exit(7) from None
    console.print(f"Training {run_id} from step {trainer.step} as {account.address}; Ctrl-C to stop.")

    def report(step: int, metrics: dict[str, float], _batch: object) -> None:
        if pretraining:
            judged = f", held-out loss {metrics['held_out_loss']:.4f}" if "held_out_loss" in metrics else ""
            console.print(
                f"step {step}: loss {metrics['loss']:.4f}, {metrics['island_tokens']:.0f} tokens{judged}, {metrics['step_s']:.1f} s"
            )
            return
        console.print(
            f"step {step}: loss {metrics['loss']:.4f}, task reward {metrics['task_reward']:.3f}, "
            f"length {metrics['length']:.1f}, clip {metrics['clip_low'] + metrics['clip_high']:.3f}, {metrics['step_s']:.1f} s"
        )

    try:
        trainer.run(stop, steps or None, on_step=report)
    except (KeyboardInterrupt, Stopped):
        pass  # asked to stop while the coordinator was away: the wait is cut short on purpose
    except Refused as e:
        err.print(f"The coordinator refused this trainer: {e}", style="red", markup=False)
        raise typer.Exit(5) from None
    finally:
        trainer.close()
    console.print(f"Stopped at policy step {trainer.step}.")


@app.command()
def lighthouse(
    bind: Annotated[str, typer.Option(help="Address to listen on (HOST:PORT; port 0 picks a free one).")] = "0.0.0.0:29510",
    min_islands: Annotated[int, typer.Option(min=1, help="Islands needed before the first outer step.")] = 1,
    join_timeout_s: Annotated[
        float, typer.Option(min=0, help="How long a forming quorum waits for more islands once it has enough.")
    ] = 2.0,
    heartbeat_timeout_s: Annotated[
        float, typer.Option(min=0.1, help="An island silent this long is left out of the next quorum.")
    ] = 5.0,
) -> None:
    """Run the quorum service trainer islands meet through (torchft's lighthouse), until Ctrl-C."""
    from torchft._torchft import LighthouseServer

    stop = stop_on_sigterm()
    server = LighthouseServer(
        bind=bind,
        min_replicas=min_islands,
        join_timeout_ms=int(join_timeout_s * 1000),
        heartbeat_timeout_ms=int(heartbeat_timeout_s * 1000),
    )
    console.print(f"Lighthouse for trainer islands at {server.address()}; Ctrl-C to stop.")
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    # It keeps no state (islands form their next quorum anew), and the interpreter's teardown of torch, which torchft
    # imports, can outlast a devnet's stop deadline on a busy machine.
    exit_now()


cli = entry_point(app)
"""The console script: ``app`` with TLS failures told in one sentence."""
