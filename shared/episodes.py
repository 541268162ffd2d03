"""Multi-turn episodes: the node runs them, the validator replays them, by the same rules.

An episode's completion is everything after the prompt: the model's turns and the environment's, in order. A model
turn ends at EOS (the episode is over), at the task's token limit (over too: finish ``length``), or at one of the
environment's stops; then the environment replies (:mod:`shared.environments.turns`), its text is tokenized and
appended (cut to what the limit leaves), and the model goes on from there, its seeded draw counting every position
of the completion. The environment may also end the episode after a stop (``reply`` returns None: finish ``stop``)
and writes at most ``max_turns`` replies; a stop past the last is read as the end of the episode.

:func:`run_episodes` is the node's side. :func:`replay_failures` is the validator's: from the file's tokens and
flags it rebuilds the model's turns, asks the environment again and requires every environment token to be exactly
what that replay produces, every model turn but the last to end at its first stop, and the episode to end as the
rules say. Hidden states are kept for every position but the last, as single-turn completions, so TOPLOC proofs
cover the whole episode's prefill.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Protocol, cast

import torch
from transformers import PreTrainedTokenizerBase

from intellect_protocol.shared.environments.bounded import PluginFailure
from intellect_protocol.shared.environments.registry import Problem, completion_text
from intellect_protocol.shared.environments.turns import Rules, turn_ended
from intellect_protocol.shared.inference import Completion, InferenceBackend, Turn
from intellect_protocol.shared.schemas import SamplingParams


class Replies(Protocol):
    def reply(self, problem: Problem, seed: int, turns: list[str]) -> str | None: ...


@dataclass
class Episode:
    """One row's episode as it is built: the completion, who wrote each token, and the model's turns' text."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)
    replies: int = 0
    finish: str | None = None

    def completion(self, width: int) -> Completion:
        hidden = torch.stack(self.hidden) if self.hidden else torch.empty(0, width, dtype=torch.bfloat16)
        return Completion(self.tokens, self.logprobs, hidden, "stop" if self.finish == "stop" else "length")


class Twice:
    """An environment asked each reply twice: one that answers the same turns differently cannot be replayed by
    anyone, and is refused with one sentence naming it (:class:`~shared.environments.bounded.PluginFailure`)."""

    def __init__(self, environment: Replies) -> None:
        self.environment = environment
        named = getattr(environment, "name", "?")
        requirement = getattr(environment, "requirement", None)
        self.described = f"environment {named!r}" + (f" ({requirement})" if requirement else "")

    def reply(self, problem: Problem, seed: int, turns: list[str]) -> str | None:
        first, second = (self.environment.reply(problem, seed, list(turns)) for _ in range(2))
        if first != second:
            raise PluginFailure(
                f"{self.described} failed on problem {problem.id!r}: its reply is not a function of the turns (asked "
                f"twice, it answered {first!r:.40} and {second!r:.40}), so no validator can replay its episodes",
                problem.id,
                turns[-1] if turns else "",
            )
        return first


def reply_tokens(tokenizer: PreTrainedTokenizerBase, text: str, rules: Rules, room: int) -> list[int]:
    """The environment's reply as tokens, cut to its bound and to the ``room`` the task's limit leaves."""
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids[: min(rules.max_reply_tokens, room)]


def run_episodes(
    backend: InferenceBackend,
    tokenizer: PreTrainedTokenizerBase,
    environment: Replies,
    rows: list[tuple[list[int], int, Problem]],
    params: SamplingParams,
    rules: Rules,
) -> list[tuple[Completion, list[bool]]]:
    """Each row's (prompt tokens, seed, problem) episode: its completion and which of its tokens the model sampled."""
    episodes = [Episode() for _ in rows]
    live = list(range(len(rows)))
    while live:
        turn = Turn(
            offsets=[len(episodes[i].tokens) for i in live],
            carried=[len(episodes[i].tokens) - len(episodes[i].hidden) for i in live],
            limits=[rules.max_tokens - len(episodes[i].tokens) for i in live],
            ended=lambda tokens: turn_ended(tokenizer, tokens, rules.stops),
        )
        prompts = [rows[i][0] + episodes[i].tokens for i in live]
        made = backend.generate(prompts, [rows[i][1] for i in live], params, turn)
        for i, completion in zip(live, made, strict=True):
            e = episodes[i]
            e.hidden += list(completion.hidden)
            e.tokens += completion.tokens
            e.logprobs += completion.logprobs
            e.sampled += [True] * len(completion.tokens)
            e.turns.append(completion_text(tokenizer, completion.tokens))
            e.finish = completion.finish_reason if completion.finish_reason != "turn" else None
            if e.finish is None and e.replies == rules.max_turns:
                e.finish = "stop"  # a stop past the environment's last turn ends the episode
        asking = [i for i in live if episodes[i].finish is None]
        answers = replies_to(environment, [(rows[i][2], rows[i][1], list(episodes[i].turns)) for i in asking])
        for i, text in zip(asking, answers, strict=True):
            _answer(episodes[i], tokenizer, text, rules)
        live = [i for i in live if episodes[i].finish is None]
    # An episode that ended on the environment's tokens has no state yet for them: one pass over them, nothing drawn.
    short = [i for i, e in enumerate(episodes) if len(e.hidden) < len(e.tokens) - 1]
    if short:
        turn = Turn(
            offsets=[len(episodes[i].tokens) for i in short],
            carried=[len(episodes[i].tokens) - 1 - len(episodes[i].hidden) for i in short],
            limits=[0] * len(short),
            ended=lambda _tokens: False,
        )
        prompts = [rows[i][0] + episodes[i].tokens[:-1] for i in short]
        for i, completion in zip(short, backend.generate(prompts, [rows[i][1] for i in short], params, turn), strict=True):
            episodes[i].hidden += list(completion.hidden)
    return [(e.completion(backend.hidden_size), e.sampled) for e in episodes]


def _answer(e: Episode, tokenizer: PreTrainedTokenizerBase, text: str | None, rules: Rules) -> None:
    """The environment's turn after a model turn that ended at a stop: its reply appended, or the episode's end."""
    if text is None:
        e.finish = "stop"
        return
    ids = reply_tokens(tokenizer, text, rules, rules.max_tokens - len(e.tokens))
    e.tokens += ids
    e.logprobs += [0.0] * len(ids)
    e.sampled += [False] * len(ids)
    e.replies += 1
    if len(e.tokens) == rules.max_tokens:
        e.finish = "length"


def replay_failures(
    tokens: list[int],
    sampled: list[bool] | None,
    finish_reason: str,
    *,
    tokenizer: PreTrainedTokenizerBase,
    environment: Replies,
    problem: Problem,
    seed: int,
    rules: Rules,
    eos: int | None,
) -> str | None:
    """Why this completion is not the episode its model turns make with the environment's replies, or None
    (:func:`replay_walk`, each reply asked of ``environment`` as the walk needs it)."""
    walk = replay_walk(tokens, sampled, finish_reason, tokenizer=tokenizer, rules=rules, eos=eos)
    try:
        turns = next(walk)
        while True:
            turns = walk.send(environment.reply(problem, seed, turns))
    except StopIteration as done:
        return cast(str | None, done.value)


def replies_to(environment: Replies, asked: list[tuple[Problem, int, list[str]]]) -> list[str | None]:
    """``environment``'s reply to each ``(problem, seed, turns)``: in one exchange where it is a bounded process."""
    batch = getattr(environment, "replies", None)
    return batch(asked) if batch is not None else [environment.reply(*a) for a in asked]


def replay_walk(
    tokens: list[int],
    sampled: list[bool] | None,
    finish_reason: str,
    *,
    tokenizer: PreTrainedTokenizerBase,
    rules: Rules,
    eos: int | None,
) -> Generator[list[str], str | None, str | None]:
    """Walks the completion as the node built it: each model turn ends at the first of EOS, the token limit and a
    stop, exactly where the node would have ended it; after a stop, the environment's tokens must be its replay.
    It yields the model's turns so far whenever the environment must answer and is sent the answer; it returns why
    this completion is not the episode its model turns make with the environment's replies, or None."""
    flags = sampled if sampled is not None else [True] * len(tokens)
    turns: list[str] = []
    position = replies = 0
    while True:
        start = position
        why = None
        while why is None:
            if position == len(tokens) or not flags[position]:
                if position == start:
                    return f"token {position}: the environment writes where the model's turn {len(turns)} should begin"
                return f"the model's turn {len(turns)} ends at token {position} without EOS, a tool call or the token limit"
            position += 1
            if eos is not None and tokens[position - 1] == eos:
                why = "stop"
            elif position == rules.max_tokens:
                why = "length"
            elif turn_ended(tokenizer, tokens[start:position], rules.stops):
                why = "turn"
        turns.append(completion_text(tokenizer, tokens[start:position]))
        if why != "turn":
            return _ends_here(position, tokens, finish_reason, why, f"the model's turn {len(turns) - 1}")
        answer = (yield list(turns)) if replies < rules.max_turns else None
        if answer is None:
            return _ends_here(position, tokens, finish_reason, "stop", "the environment")
        expected = reply_tokens(tokenizer, answer, rules, rules.max_tokens - position)
        written = tokens[position : position + len(expected)]
        labelled = flags[position : position + len(expected)]
        if (
            written != expected
            or any(labelled)
            or (position + len(expected) < len(tokens) and not flags[position + len(expected)])
        ):
            end = position + len(expected)
            longer = end < len(tokens) and not flags[end]
            return (
                f"the environment's reply to the model's turn {len(turns) - 1} is not what the environment gives "
                f"(at tokens {position}-{end}{', and the file writes more' if longer else ''}"
                f"{', some labelled as sampled' if any(labelled) else ''})"
            )
        position += len(expected)
        replies += 1
        if position == rules.max_tokens:
            return _ends_here(position, tokens, finish_reason, "length", "the environment's reply")
        if position == len(tokens):
            return "the episode stops after the environment's reply, before the model's answer"


def _ends_here(position: int, tokens: list[int], finish_reason: str, why: str, who: str) -> str | None:
    if position != len(tokens):
        return f"{who} ended the episode at token {position}, yet the file goes on to {len(tokens)}"
    if finish_reason != why:
        return f"the episode ended with {why}, yet the file says {finish_reason}"
    return None
