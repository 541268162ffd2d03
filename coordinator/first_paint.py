"""The leaderboard page's first paint, rendered on the server: the run, the network's figures and the top of the
leaderboard, in the page's own HTML, so a headless screenshot, a text browser or a reader without scripts sees
the numbers. The page's script replaces it at its first refresh with the live, sortable view."""

from __future__ import annotations

from decimal import Decimal
from html import escape

from intellect_protocol.shared.public_schemas import LeaderboardRow, NetworkStatus

FIRST_ROWS = 20
"""Leaderboard rows in the first paint (the script shows them all)."""


def run_line(net: NetworkStatus) -> str:
    run = net.run
    return escape(f"Run {run.name} · {run.environment} · {run.model}") if run else "No active run"


def view(net: NetworkStatus, rows: list[LeaderboardRow]) -> str:
    """The ``<main>`` element's first content: the status panel and the leaderboard's first rows."""
    rejection = f"{100 * net.rejection_rate:.1f} %" if net.rejection_rate is not None else "–"
    stats = [
        ("Policy step", f"{net.policy_step:,}", "stat-policy-step"),
        ("Nodes online", f"{net.nodes_online:,}", "stat-nodes-online"),
        ("Rollouts / min", f"{net.rollouts_per_minute:,.1f}", "stat-rollouts"),
        ("Validation backlog", f"{net.validation_backlog:,}", "stat-backlog"),
        ("Rejection rate", rejection, "stat-rejection"),
        ("Relays", f"{net.relays:,}", "stat-relays"),
        ("New work", net.work.message if net.work else "handed out", "stat-work"),
    ]
    panel = "".join(f'<div><dt>{escape(label)}</dt><dd id="{key}">{escape(value)}</dd></div>' for label, value, key in stats)
    stalled = f'<p class="alert" role="alert">{escape(net.learning_stalled)}</p>' if net.learning_stalled else ""
    body = "".join(
        f'<tr data-address="{escape(r.address)}"><td class="num">{r.rank}</td><td class="address">{escape(r.address)}</td>'
        f'<td class="num">{_credit(r.final_credit)}</td><td class="num">{r.accepted:,}</td></tr>'
        for r in rows[:FIRST_ROWS]
    )
    table = (
        '<table id="leaderboard"><thead><tr><th scope="col" class="num">Rank</th><th scope="col">Node</th>'
        '<th scope="col" class="num">Final credit</th><th scope="col" class="num">Accepted</th></tr></thead>'
        f"<tbody>{body or '<tr><td colspan=4>No nodes yet.</td></tr>'}</tbody></table>"
    )
    return (
        f'<section aria-labelledby="status-title"><h2 id="status-title">Network status</h2><dl class="stats">{panel}</dl>'
        f"{stalled}</section>"
        f'<section aria-labelledby="board-title"><h2 id="board-title">Leaderboard</h2><div class="table-wrap">{table}</div></section>'
    )


def _credit(micro: int) -> str:
    """Credit micro-units as work units, to a millionth, trailing zeros dropped down to two (as the script shows it)."""
    text = f"{Decimal(micro) / 10**6:,.6f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"
