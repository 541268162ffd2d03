"""Toy arithmetic for the tiny model: column addition written out digit by digit.

A prompt is ``"347+285:"``; the expected completion works right to left, carrying::

    c1:7+5+0=12;c2:4+8+1=13;c3:3+2+1=06;=632

(each step: the column, its two digits, the carry in, their two-digit sum), then the
end-of-sequence token. Three-digit problems give completions of 40 or 41 characters, so
their proofs span two 32-token TOPLOC chunks.
"""

from __future__ import annotations

import random
import re

ANSWER = re.compile(r"=(\d{1,12})$")


def make_problem(rng: random.Random, digits: int = 3) -> tuple[str, int]:
    """A prompt and its answer, both operands drawn with exactly ``digits`` digits."""
    low, high = 10 ** (digits - 1), 10**digits - 1
    a, b = rng.randint(low, high), rng.randint(low, high)
    return f"{a}+{b}:", a + b


def scratchpad(prompt: str) -> str:
    """The reference completion for ``prompt`` (without the end-of-sequence token)."""
    a, b = prompt.rstrip(":").split("+")
    width = max(len(a), len(b))
    a, b = a.zfill(width), b.zfill(width)
    steps, carry = [], 0
    for column, (da, db) in enumerate(zip(reversed(a), reversed(b)), start=1):
        total = int(da) + int(db) + carry
        steps.append(f"c{column}:{da}+{db}+{carry}={total:02d}")
        carry = total // 10
    return ";".join(steps) + f";={int(a) + int(b)}"


HELD_OUT_SEED = 2024


def held_out_problems(n: int = 200) -> list[tuple[str, int]]:
    """The held-out problems every figure of held-out accuracy on arithmetic is measured on (``training.json`` of
    the shipped model, the devnet, tests and benchmarks), so the numbers they print compare."""
    rng = random.Random(HELD_OUT_SEED)
    return [make_problem(rng) for _ in range(n)]


def reward(completion: str, answer: int) -> float:
    """1.0 when the completion ends with ``=<answer>``, else 0.0."""
    match = ANSWER.search(completion.strip())
    return 1.0 if match is not None and int(match.group(1)) == answer else 0.0


def main() -> None:
    """``python -m intellect_protocol.shared.environments.arithmetic --count N --out FILE.jsonl``: write a problem set."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Write arithmetic problems as JSONL (id, prompt, answer).")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--digits", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w") as out:
        for i in range(args.count):
            prompt, answer = make_problem(rng, args.digits)
            out.write(json.dumps({"id": f"a{i}", "prompt": prompt, "answer": str(answer)}) + "\n")


if __name__ == "__main__":
    main()
