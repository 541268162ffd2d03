"""``intellect-coordinator run``: create runs (RL, or pretraining on a tokenized corpus) and list the environments
an RL run can name."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from intellect_protocol.coordinator.blobs import BlobStoreUnavailable
from intellect_protocol.coordinator.cli_support import DatabaseUrl, database_command, err, sessions, settings_for
from intellect_protocol.shared.island_schemas import OuterSettings
from intellect_protocol.shared.pretraining.manifest import CorpusError, CorpusManifest, load_manifest
from intellect_protocol.shared.pretraining.settings import PretrainSettings
from intellect_protocol.shared.run_schemas import RUN_DEFAULTS, AuditPolicy
from intellect_protocol.shared.states import RunKind

PRETRAIN_DEFAULTS = PretrainSettings()

runs_app = typer.Typer(help="Create RL runs and list the environments they can name.", no_args_is_help=True)


@runs_app.command("create")
@database_command
def run_create(
    name: Annotated[str, typer.Option(help="A unique name for the run.")],
    environment: Annotated[
        str,
        typer.Option(help="An installed environment plugin (built in: arithmetic, math, code); the run pins its version."),
    ] = RUN_DEFAULTS.environment,
    model: Annotated[str, typer.Option(help="Model path or hub id; default: the shipped tiny model.")] = RUN_DEFAULTS.model,
    prompts_per_task: Annotated[int, typer.Option(help="Prompts in one task (1 to 1024).")] = RUN_DEFAULTS.prompts_per_task,
    samples_per_prompt: Annotated[
        int, typer.Option(help="Samples per prompt, the GRPO group size (1 to 256).")
    ] = RUN_DEFAULTS.samples_per_prompt,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0 to 10).")] = RUN_DEFAULTS.sampling.temperature,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (above 0, at most 1).")] = RUN_DEFAULTS.sampling.top_p,
    max_tokens: Annotated[int, typer.Option(help="Longest completion.")] = RUN_DEFAULTS.sampling.max_tokens,
    length_alpha: Annotated[
        float, typer.Option(help="Thinking-budget penalty per token off target; 0 disables it.")
    ] = RUN_DEFAULTS.length_budget.alpha,
    target_length: Annotated[
        int, typer.Option(help="Thinking-budget target length, in tokens.")
    ] = RUN_DEFAULTS.length_budget.target_tokens,
    length_over_only: Annotated[
        bool, typer.Option(help="Penalise only tokens past the target (a ceiling), not short answers too.")
    ] = RUN_DEFAULTS.length_budget.over_only,
    system_prompt: Annotated[
        str | None,
        typer.Option(help="A system turn before every problem (rendered by the model's chat template; without one, prepended)."),
    ] = None,
    thinking: Annotated[
        bool | None,
        typer.Option(
            "--thinking/--no-thinking",
            help="The chat template's enable_thinking switch (Qwen3-style templates); default: the template's own.",
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="Tolerances calibrated on the run's model (the JSON `intellect-validator calibrate --out` writes); the run "
            "then admits only the numerics calibrated. Default: the shipped model's bounds, any numerics.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    async_level: Annotated[
        int, typer.Option(help="Accept rollouts of policies at most this many steps old (0: synchronous; at most 64).")
    ] = RUN_DEFAULTS.async_level,
    audit_share: Annotated[
        float,
        typer.Option(
            help="Share of accepted work a second validator checks before training (new nodes and suspect validators get more).",
        ),
    ] = AuditPolicy().share,
    dispute_window: Annotated[
        float | None,
        typer.Option(help="Seconds credit stays pending (clawback possible) before it is final; default: the coordinator's."),
    ] = None,
    min_stake: Annotated[
        str,
        typer.Option(
            help="Tokens (an exact decimal, e.g. 50 or 0.5) a node must have staked to lease this run's tasks (needs settlement on a chain); 0: none."
        ),
    ] = "0",
    sync_every: Annotated[
        int, typer.Option(help="Trainer islands: inner GRPO steps between outer steps (DiLoCo's H).")
    ] = OuterSettings().sync_every,
    outer_lr: Annotated[
        float | None,
        typer.Option(
            help="Trainer islands: the outer Nesterov SGD's learning rate; default 1.0 (plain averaging) below H = 50, 0.7 from there."
        ),
    ] = None,
    outer_momentum: Annotated[
        float | None,
        typer.Option(help="Trainer islands: the outer Nesterov SGD's momentum; default 0 below H = 50, 0.9 from there."),
    ] = None,
    min_islands: Annotated[
        int,
        typer.Option(
            help="Trainer islands: fewest islands whose pseudo-gradients an outer step judges (3 resists one lying island; 1 lets any step alone)."
        ),
    ] = OuterSettings().min_islands,
    overlap: Annotated[
        bool,
        typer.Option(
            help="Pretraining: the islands' meetings run while their next inner steps do (Streaming DiLoCo's overlap): a slow link costs no waiting."
        ),
    ] = False,
    kind: Annotated[
        RunKind, typer.Option(help="rl: nodes roll out the environment; pretrain: trainer islands learn --corpus.")
    ] = RunKind.rl,
    corpus: Annotated[
        Path | None,
        typer.Option(
            help="Pretraining: a tokenized corpus directory (corpus.json and shards/); every shard is checked and put in the blob store.",
            file_okay=False,
        ),
    ] = None,
    epochs: Annotated[int, typer.Option(help="Pretraining: passes over every training shard.")] = PRETRAIN_DEFAULTS.epochs,
    batch_rows: Annotated[int, typer.Option(help="Pretraining: rows an inner step learns from.")] = PRETRAIN_DEFAULTS.batch_rows,
    learning_rate: Annotated[float, typer.Option(help="Pretraining: the inner AdamW's learning rate.")] = PRETRAIN_DEFAULTS.lr,
    seed: Annotated[int, typer.Option(help="Pretraining: with the epoch, orders each shard's rows.")] = PRETRAIN_DEFAULTS.seed,
    island_audit_rate: Annotated[
        float, typer.Option(help="Pretraining: share of islands' outer steps validators replay, drawn after each is published.")
    ] = PRETRAIN_DEFAULTS.audit_rate,
    island_audit_votes: Annotated[
        int,
        typer.Option(
            help="Pretraining: verdicts an island audit waits for at least; then all passing, or a majority of two or more, decide."
        ),
    ] = PRETRAIN_DEFAULTS.audit_votes,
    island_audit_second_opinion: Annotated[
        float,
        typer.Option(
            help="Pretraining: share of island audits one passing verdict would decide that a second validator replays."
        ),
    ] = PRETRAIN_DEFAULTS.audit_second_opinion,
    database_url: DatabaseUrl = None,
) -> None:
    """Create an active run: an RL run nodes lease tasks of, or (--kind pretrain --corpus DIR) a pretraining run
    trainer islands learn."""
    from pydantic import ValidationError

    from intellect_protocol.coordinator.errors import ApiError
    from intellect_protocol.coordinator.services.runs import create_run
    from intellect_protocol.shared.environments.length import LengthBudget
    from intellect_protocol.shared.money import parse_tokens
    from intellect_protocol.shared.prompting import Prompting
    from intellect_protocol.shared.run_schemas import RunSpec
    from intellect_protocol.shared.schemas import SamplingParams

    pretraining = kind == RunKind.pretrain
    if pretraining != (corpus is not None):
        err.print("A pretraining run (--kind pretrain) needs --corpus DIR, and only a pretraining run takes one.", markup=False)
        raise typer.Exit(2)
    try:
        manifest = stored_corpus(corpus, model, database_url) if corpus is not None else None
    except (CorpusError, BlobStoreUnavailable) as e:
        err.print(f"--corpus {corpus}: {e}.", markup=False)
        raise typer.Exit(2) from None
    try:
        settings = (
            PretrainSettings(
                epochs=epochs,
                batch_rows=batch_rows,
                lr=learning_rate,
                seed=seed,
                audit_rate=island_audit_rate,
                audit_votes=island_audit_votes,
                audit_second_opinion=island_audit_second_opinion,
            )
            if pretraining
            else None
        )
        spec = RunSpec(
            name=name,
            kind=kind,
            corpus=manifest,
            pretrain=settings,
            environment=environment,
            model=model,
            sampling=SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens),
            prompts_per_task=prompts_per_task,
            samples_per_prompt=samples_per_prompt,
            length_budget=LengthBudget(alpha=length_alpha, target_tokens=target_length, over_only=length_over_only),
            prompting=Prompting(system_prompt=system_prompt, enable_thinking=thinking),
            tolerances=_calibrated(calibration) if calibration else None,
            async_level=async_level,
            dispute_window_s=dispute_window,
            audit=AuditPolicy(share=audit_share),
            min_stake=parse_tokens(min_stake, allow_zero=True),
            outer=OuterSettings(
                sync_every=sync_every, outer_lr=outer_lr, outer_momentum=outer_momentum, min_islands=min_islands, overlap=overlap
            ),
        )
    except ValidationError as e:
        where = ".".join(map(str, e.errors()[0]["loc"]))
        err.print(f"Invalid run setting {where}: {e.errors()[0]['msg']}.", markup=False)
        raise typer.Exit(2) from None
    except CalibrationError as e:
        err.print(f"--calibration {calibration}: {e}.", markup=False)
        raise typer.Exit(2) from None
    except ValueError as e:
        err.print(f"--min-stake: {e}.", markup=False)
        raise typer.Exit(2) from None
    ledger = sessions(database_url)
    try:
        with ledger.begin() as session:
            run = create_run(session, spec, datetime.now(UTC))
    except ApiError as e:
        err.print(f"{e.message}", style="red", markup=False)
        raise typer.Exit(2) from None
    if calibration is None and model != RUN_DEFAULTS.model and not pretraining:
        err.print(
            f"{run.id} is not calibrated on {model}: validators judge it by the shipped model's tolerances, a guess "
            "about any other model. Measure them with intellect-validator calibrate --model ... --out FILE and send the "
            "file's tolerances in PATCH /v1/admin/runs/ID before nodes join.",
            style="yellow",
            markup=False,
        )
    print(run.id)


def stored_corpus(directory: Path, model: str, database_url: str | None) -> CorpusManifest:
    """``directory``'s corpus manifest, once every shard it names has been checked (:func:`read_shard`) and put in
    this coordinator's blob store; :class:`CorpusError` if a shard is not what the manifest says, or ``model`` (a
    local directory) was not made for it."""
    from intellect_protocol.coordinator.app import blob_store
    from intellect_protocol.coordinator.services.pretraining import shard_key
    from intellect_protocol.shared.models import resolve_model
    from intellect_protocol.shared.pretraining.corpus import load_shard, shard_path

    manifest = load_manifest(directory)
    _require_model_for(manifest, Path(resolve_model(model)))
    for ref in manifest.every_shard():
        load_shard(directory, ref, manifest)  # all checked before any is stored
    blobs = blob_store(settings_for(database_url))
    blobs.staging.mkdir(parents=True, exist_ok=True)
    for ref in manifest.every_shard():
        staged = blobs.staging / f"{ref.sha256}.corpus"
        shutil.copyfile(shard_path(directory, ref), staged)
        blobs.put_file(shard_key(ref.sha256), staged)
    return manifest


def _require_model_for(manifest: CorpusManifest, model: Path) -> None:
    """A local model directory must embed every id of the corpus and hold the tokenizer that made it."""
    if not model.is_dir():
        return  # a hub id: its config is read where it is loaded
    config, tokenizer = model / "config.json", model / "tokenizer.json"
    vocab = json.loads(config.read_text()).get("vocab_size", 0) if config.is_file() else 0
    if vocab < manifest.vocab_size:
        raise CorpusError(f"the model in {model} embeds {vocab} ids, fewer than the corpus' {manifest.vocab_size}")
    if tokenizer.is_file() and hashlib.sha256(tokenizer.read_bytes()).hexdigest() != manifest.tokenizer_sha256:
        raise CorpusError(f"the tokenizer in {model} is not the one that made the corpus")


class CalibrationError(ValueError):
    """A ``--calibration`` file without the tolerances ``intellect-validator calibrate --out`` writes."""


def _calibrated(path: Path) -> dict[str, object]:
    try:
        written = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CalibrationError(f"cannot be read as JSON ({e})") from None
    tolerances = written.get("tolerances") if isinstance(written, dict) else None
    if not isinstance(tolerances, dict):
        raise CalibrationError("has no tolerances (write one with intellect-validator calibrate --out FILE)")
    return tolerances


@runs_app.command("environments")
def run_environments() -> None:
    """List the environments a run can name here: the built-in ones and every installed plugin, with the version a new run pins."""
    from intellect_protocol.shared.environments.registry import EnvironmentUnavailable, installed

    try:
        plugins = installed()
    except EnvironmentUnavailable as e:
        err.print(f"{e}.", style="red", markup=False)
        raise typer.Exit(2) from None
    for name, found in sorted(plugins.items()):
        print(f"{name}\t{found.pin}")
