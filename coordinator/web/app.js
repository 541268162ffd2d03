// The leaderboard page: plain DOM, no dependencies, every string set as text (node-supplied data is untrusted).
const REFRESH_MS = 5000;
const COLORS = ["#0b57d0", "#b3261e", "#146c2e", "#7d5260", "#8a5a00", "#006a6a"];
const state = { sort: { key: "rank", dir: "ascending" }, search: "", runId: null };

function h(tag, attrs = {}, ...children) {
  const el = tag === "svg" || attrs.svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "svg" || v === undefined || v === null) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}
const s = (tag, attrs = {}, ...children) => h(tag, { ...attrs, svg: true }, ...children);

async function get(path) {
  const reply = await fetch(path, { headers: { accept: "application/json" } });
  if (!reply.ok) throw new Error(`${path}: ${reply.status}`);
  return reply.json();
}

const fmt = {
  num: (x, d = 0) => (x === null || x === undefined ? "–" : Number(x).toLocaleString("en", { maximumFractionDigits: d, minimumFractionDigits: d })),
  pct: (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)} %`),
  ago: (iso) => {
    if (!iso) return "–";
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    return s < 90 ? `${s.toFixed(0)} s ago` : s < 5400 ? `${(s / 60).toFixed(0)} min ago` : `${(s / 3600).toFixed(1)} h ago`;
  },
  time: (iso) => (iso ? new Date(iso).toLocaleString() : "–"),
  short: (id) => (id.length > 16 ? `${id.slice(0, 12)}…` : id),
  // An integer amount of base units (a number or a decimal string) as an exact decimal: BigInt
  // arithmetic, never a float, so no rounding noise; at most `shown` decimals, trailing zeros
  // dropped down to `least`.
  exact: (x, decimals, shown, least = 0) => {
    if (x === null || x === undefined) return "–";
    const n = BigInt(x), unit = 10n ** BigInt(decimals), abs = n < 0n ? -n : n;
    const digits = ((abs % unit) / 10n ** BigInt(decimals - shown)).toString().padStart(shown, "0");
    const frac = digits.replace(/0+$/, "").padEnd(least, "0");
    return `${n < 0n ? "-" : ""}${(abs / unit).toLocaleString("en")}${frac ? "." + frac : ""}`;
  },
  // Token base units (a decimal string: beyond a JS number) as tokens of the chain's decimals, to a millionth.
  tokens: (x, decimals) => fmt.exact(x, decimals, 6, 2),
  // Credit micro-units (integers) as work units, to a millionth as tokens are: the two compare digit for digit.
  credit: (x) => fmt.exact(x, 6, 6, 2),
};

// ---- charts -------------------------------------------------------------------------------------

function lineChart(title, series, xLabel) {
  const W = 360, H = 200, L = 44, R = 10, T = 10, B = 30;
  const points = series.flatMap((sr) => sr.points);
  const figure = h("figure", {}, h("figcaption", {}, title));
  if (points.length === 0) {
    figure.append(h("p", { class: "muted" }, "No data yet."));
    return figure;
  }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  // One point (or a flat line): a narrow range around it, not a unit that dwarfs the value.
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { const pad = Math.max(Math.abs(y0) * 0.1, 0.01); y0 -= pad; y1 += pad; }
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const described = series.map((sr) => `${sr.name}: ${sr.points.length} points, last ${fmt.num(sr.points.at(-1)?.[1], 3)}`).join("; ");
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${title}. ${described}`, "data-points": points.length });
  svg.append(
    s("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#767676" }),
    s("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#767676" }),
    s("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, fmt.num(y1, Math.abs(y1) >= 100 ? 0 : 2)),
    s("text", { x: L - 4, y: H - B, "text-anchor": "end" }, fmt.num(y0, Math.abs(y1) >= 100 ? 0 : 2)),
    s("text", { x: L, y: H - B + 14 }, xLabel.format(x0)),
    s("text", { x: W - R, y: H - B + 14, "text-anchor": "end" }, xLabel.format(x1)),
    s("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" }, xLabel.name),
  );
  series.forEach((sr, i) => {
    if (sr.points.length === 0) return;
    const d = sr.points.map(([x, y], j) => `${j ? "L" : "M"}${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(" ");
    // Later series are dashed, so one lying on top of another (reward = task reward without a length penalty) stays visible.
    svg.append(s("path", { d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 2, "stroke-dasharray": i ? "6 4" : null, class: "series" }));
    for (const [x, y] of sr.points) svg.append(s("circle", { cx: X(x), cy: Y(y), r: 2.5, fill: COLORS[i % COLORS.length] }));
  });
  const same = (a, b) => a.points.length === b.points.length && a.points.every(([x, y], j) => x === b.points[j][0] && y === b.points[j][1]);
  const legend = h("ul", { class: "legend" }, series.map((sr, i) => h("li", {}, h("span", { style: `background:${COLORS[i % COLORS.length]}` }),
    sr.name, i && same(sr, series[0]) ? ` (dashed: equal to ${series[0].name})` : "")));
  figure.append(svg, legend);
  return figure;
}

const stepAxis = { name: "policy step", format: (x) => fmt.num(x) };
const timeAxis = { name: "time", format: (x) => new Date(x).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) };

// Where each policy step's wall clock went, from the coordinator's own timestamps.
const PHASES = [["node_s", "node (lease to upload)"], ["upload_s", "upload"], ["validation_s", "validation"],
  ["trainer_wait_s", "trainer waiting"], ["training_s", "training"]];

const stepSeries = (rows, key) => rows.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]);

function charts(progress, throughput, timing, run) {
  if (run?.kind === "pretrain") return pretrainingCharts(progress);
  const environment = run?.environment;
  const first = throughput.findIndex((b) => b.rollouts > 0);
  throughput = first > 0 ? throughput.slice(first) : throughput; // from the first upload: a bucket before it is from before the run
  return h("div", { class: "charts" },
    lineChart("Reward per policy step", [
      { name: "reward", points: stepSeries(progress.steps, "reward") },
      { name: "task reward", points: stepSeries(progress.steps, "task_reward") },
    ], stepAxis),
    accuracyChart(progress, stepSeries(progress.evaluations, "heldout_accuracy"), [
      ["correct tool calls", stepSeries(progress.evaluations, "heldout_tool_calls")],
      ["within the thinking budget", stepSeries(progress.evaluations, "heldout_within_budget")],
    ], environment),
    lineChart("Throughput", [
      { name: "rollouts / min", points: throughput.map((b) => [Date.parse(b.start), b.rollouts]) },
    ], timeAxis),
    lineChart("Seconds per policy step", PHASES.map(([key, name]) => ({ name, points: stepSeries(timing, key) })), stepAxis),
  );
}

// A pretraining run has no rollouts: the island that publishes each step judges it on the corpus' held-out reads.
function pretrainingCharts(progress) {
  return h("div", { class: "charts" },
    lineChart("Held-out loss per policy step", [{ name: "held-out loss (nats a token)", points: stepSeries(progress.steps, "held_out_loss") }], stepAxis),
    lineChart("Out-of-distribution AUROC", [{ name: "unseen sources told apart", points: stepSeries(progress.steps, "ood_auroc") }], stepAxis),
    lineChart("Seconds per policy step", [{ name: "outer step", points: stepSeries(progress.steps, "step_s") }], stepAxis),
  );
}

// Evaluated beside the run, which moves on meanwhile: the caption says how far behind the last point is.
function accuracyChart(progress, points, shares, environment) {
  const reached = progress.steps.length ? progress.steps[progress.steps.length - 1].step : 0;
  const last = points.length ? points[points.length - 1][0] : null;
  const title = last === null || last === reached ? "Held-out accuracy" : `Held-out accuracy (last measured at step ${last}; the run is at ${reached})`;
  // A tool-using environment's evaluations also say how many episodes made a correct tool call; a run under a
  // thinking budget's, how many completions kept to it.
  const lines = [{ name: "held-out accuracy", points }, ...shares.filter(([, p]) => p.length).map(([name, p]) => ({ name, points: p }))];
  const figure = lineChart(title, lines, stepAxis);
  // What it measures: the run's own task, never a fixed one (the devnet scores each step so).
  if (environment) figure.append(h("p", { class: "muted chart-note" }, `Mean reward on ${environment}'s held-out problems, greedy`));
  return figure;
}

// ---- the leaderboard view ---------------------------------------------------------------------

const COLUMNS = [
  { key: "rank", label: "#", num: true },
  { key: "address", label: "Node" },
  { key: "status", label: "Status" },
  { key: "final_credit", label: "Final credit", num: true },
  { key: "pending_credit", label: "Pending credit", num: true, wide: true },
  { key: "accepted_tokens", label: "Accepted tokens", num: true, wide: true },
  { key: "acceptance_rate", label: "Acceptance", num: true },
  { key: "last_seen", label: "Last seen", wide: true },
];

function statusPanel(net) {
  const item = (label, value, id, title = "") => h("div", {}, h("dt", {}, label), h("dd", { id, title }, value));
  return h("dl", { class: "stats" },
    item("Policy step", fmt.num(net.policy_step), "stat-policy-step"),
    item("Nodes online", fmt.num(net.nodes_online), "stat-nodes-online"),
    item("Rollouts / min", fmt.num(net.rollouts_per_minute, 1), "stat-rollouts"),
    item("Validation backlog", fmt.num(net.validation_backlog), "stat-backlog"),
    item("Rejection rate", fmt.pct(net.rejection_rate), "stat-rejection"),
    item("Relays", fmt.num(net.relays), "stat-relays"),
    // The coordinator's message says what new work waits for; long ones are cut to the card, whole on hover.
    item("New work", net.work ? net.work.message : "handed out", "stat-work", net.work ? net.work.message : ""),
  );
}

function sortedRows(rows) {
  const { key, dir } = state.sort;
  const sign = dir === "ascending" ? 1 : -1;
  const needle = state.search.trim().toLowerCase();
  return rows
    .filter((r) => !needle || r.address.toLowerCase().includes(needle))
    .sort((a, b) => {
      const [x, y] = [a[key] ?? -Infinity, b[key] ?? -Infinity];
      return (x < y ? -1 : x > y ? 1 : 0) * sign || a.rank - b.rank;
    });
}

function leaderboardTable(rows) {
  const head = h("tr", {}, COLUMNS.map((c) => {
    const sorted = state.sort.key === c.key ? state.sort.dir : "none";
    const toggle = () => {
      // A new column sorts best-first (descending numbers, ascending rank and address); the same column flips.
      const same = state.sort.key === c.key;
      const dir = same ? (state.sort.dir === "ascending" ? "descending" : "ascending") : c.key === "rank" || c.key === "address" ? "ascending" : "descending";
      state.sort = { key: c.key, dir };
      renderTable();
    };
    return h("th", { scope: "col", class: [c.num ? "num" : "", c.wide ? "wide" : ""].join(" "), "aria-sort": sorted }, h("button", { type: "button", onclick: toggle }, c.label));
  }));
  const body = sortedRows(rows).map((r) => h("tr", { "data-address": r.address },
    h("td", { class: "num" }, r.rank),
    h("td", {}, h("a", { href: `#/node/${r.address}`, class: "address" }, fmt.short(r.address))),
    h("td", { class: `status-${r.status}` }, r.status),
    h("td", { class: "num" }, fmt.credit(r.final_credit)),
    h("td", { class: "num wide" }, fmt.credit(r.pending_credit)),
    h("td", { class: "num wide" }, fmt.num(r.accepted_tokens)),
    h("td", { class: "num" }, fmt.pct(r.acceptance_rate)),
    h("td", { class: "wide" }, fmt.ago(r.last_seen)),
  ));
  return h("table", { id: "leaderboard" },
    h("caption", {}, `${body.length} node${body.length === 1 ? "" : "s"}, ranked by final credit, then pending credit`),
    h("thead", {}, head), h("tbody", {}, body.length ? body : h("tr", {}, h("td", { colspan: COLUMNS.length }, "No nodes match."))));
}

let lastRows = [];
function renderTable() {
  const wrap = document.getElementById("table-wrap");
  if (wrap) wrap.replaceChildren(leaderboardTable(lastRows));
}

function validatorsTable(validators) {
  const rows = validators.map((v) => h("tr", { "data-validator": v.address },
    h("td", {}, h("span", { class: "address" }, fmt.short(v.address))),
    h("td", { class: v.active ? "status-healthy" : "status-banned", title: v.revoke_reason ?? "" }, v.active ? "active" : "revoked"),
    h("td", { class: "num" }, fmt.num(v.verdicts)),
    h("td", { class: "num wide" }, fmt.num(v.compared)),
    h("td", { class: "num" }, fmt.pct(v.agreement_rate)),
    h("td", { class: "num" }, fmt.num(v.strikes)),
    h("td", { class: "num" }, fmt.num(v.rows_trained_then_rejected)),
  ));
  return h("table", { id: "validators" },
    h("caption", {}, "Agreement: how often a validator's verdict matched the majority when another validator judged the same work. "
      + "Trained, then rejected: rows of work it approved that the trainer had read before the approval was reversed"),
    h("thead", {}, h("tr", {}, ["Validator", "Role", "Verdicts", "Compared", "Agreement", "Strikes", "Trained, then rejected"].map((t, i) =>
      h("th", { scope: "col", class: i >= 2 ? (i === 3 ? "num wide" : "num") : "" }, t)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 7 }, "No validators yet."))));
}

function islandsSection(islands) {
  const pretraining = islands.some((i) => i.tokens !== null && i.tokens !== undefined);
  const rows = islands.map((i) => h("tr", { "data-island": i.name },
    h("td", {}, i.name),
    h("td", {}, h("span", { class: "address" }, fmt.short(i.address))),
    h("td", { class: "num" }, i.outer_step < 0 ? "none yet" : fmt.num(i.outer_step)),
    h("td", { class: "num" }, fmt.num(i.claimed)),
    h("td", { class: "num" }, fmt.num(i.pending)),
    h("td", { class: "num" }, fmt.num(i.consumed)),
    pretraining ? h("td", { class: "num" }, fmt.num(i.tokens ?? 0)) : "",
    h("td", { class: "num", title: i.last_exclusion ?? "" }, fmt.num(i.excluded_steps)),
    h("td", { class: "wide" }, fmt.time(i.last_seen)),
  ));
  return h("section", { "aria-labelledby": "islands-title" },
    h("h2", { id: "islands-title" }, "Trainer islands"),
    h("div", { class: "table-wrap" }, h("table", { id: "islands" },
      h("caption", {}, `Trainer sites that each learn from their own share of ${pretraining ? "the corpus' shards" : "accepted work"} and average it every few steps (DiLoCo). `
        + "Held: claimed, not yet in an outer step; in step: averaged into a step not yet published; trained: in a published step. "
        + "Outer step: the island's last; its agreed weights are published as the next policy step, so it reads one behind the run's"),
      h("thead", {}, h("tr", {}, ["Island", "Trainer", "Outer step", "Held", "In step", "Trained", ...(pretraining ? ["Tokens"] : []), "Left out", "Last seen"].map((t, i, all) =>
        h("th", { scope: "col", class: i >= 2 && i < all.length - 1 ? "num" : "" }, t)))),
      h("tbody", {}, rows))));
}

function settlementSection(overview) {
  const tokens = (x) => fmt.tokens(x, overview.chain.token_decimals);
  const epochs = overview.epochs.map((e) => h("tr", { "data-epoch": e.epoch },
    h("td", { class: "num" }, fmt.num(e.epoch)),
    h("td", {}, h("span", { class: "address", title: e.root }, fmt.short(e.root))),
    h("td", { class: "num" }, fmt.num(e.addresses)),
    h("td", { class: "num" }, tokens(e.total)),
    h("td", {}, e.tx_hash ? h("span", { class: "address", title: e.tx_hash }, `${fmt.short(e.tx_hash)} (block ${e.block})`) : h("span", { class: "muted" }, "waiting for the chain")),
    h("td", { class: "wide" }, fmt.time(e.cutoff)),
  ));
  const nodes = overview.nodes.map((n) => h("tr", { "data-node": n.address },
    h("td", {}, h("a", { href: `#/node/${n.address}`, class: "address" }, fmt.short(n.address))),
    ...[n.staked, n.unbonding, n.slashed, n.earned, n.claimed, n.claimable].map((v) => h("td", { class: "num" }, tokens(v))),
  ));
  const head = (titles, numeric) => h("thead", {}, h("tr", {}, titles.map((t, i) => h("th", { scope: "col", class: numeric(i) ? "num" : "" }, t))));
  return h("section", { "aria-labelledby": "settlement-title" },
    h("h2", { id: "settlement-title" }, "Settlement"),
    h("p", { class: "muted" }, `Chain ${overview.chain.chain_id ?? "?"}: credit distributor `, h("span", { class: "address" }, overview.chain.distributor),
      ", stake registry ", h("span", { class: "address" }, overview.chain.stake_registry),
      ". Check any root yourself with intellect-node verify-epoch.", overview.chain_error ? h("span", { role: "status" }, ` The chain is not answering: ${overview.chain_error}`) : ""),
    h("div", { class: "table-wrap" }, h("table", { id: "epochs" },
      h("caption", {}, "Each epoch's Merkle root of cumulative final credit, and the transaction that anchored it"),
      head(["Epoch", "Root", "Addresses", "Total (tokens)", "Transaction", "Cutoff"], (i) => i === 0 || i === 2 || i === 3),
      h("tbody", {}, epochs.length ? epochs : h("tr", {}, h("td", { colspan: 6 }, "No epoch closed yet (credit becomes final after the dispute window)."))))),
    h("div", { class: "table-wrap" }, h("table", { id: "stakes" },
      h("caption", {}, overview.epochs.length
        ? `Stakes, slashes and claims (tokens). Earned: final credit as of epoch ${Math.max(...overview.epochs.map((e) => e.epoch))}, the newest anchored; the leaderboard's final credit is as of now`
        : "Stakes, slashes and claims (tokens)"),
      head(["Node", "Staked", "Unbonding", "Slashed", "Earned", "Claimed", "Claimable"], (i) => i > 0),
      h("tbody", {}, nodes.length ? nodes : h("tr", {}, h("td", { colspan: 7 }, "No nodes yet."))))),
  );
}

function showRun(net) {
  const setOn = net.run?.tolerances_set_at ? ` on ${net.run.tolerances_set_at.slice(0, 10)}` : "";
  const widened = net.run && net.run.tolerances_widened_by > 1 ? ` · tolerances widened to ${net.run.tolerances_widened_by}x the shipped model's bounds${setOn}` : "";
  document.getElementById("run-name").textContent = net.run ? `Run ${net.run.name} · ${net.run.environment} · ${net.run.model}${widened}` : "No active run";
}

async function showLeaderboard(view) {
  const [net, rows, validators, settlement] = await Promise.all([
    get("/v1/public/network"), get("/v1/public/leaderboard"), get("/v1/public/validators"), get("/v1/public/settlement"),
  ]);
  lastRows = rows;
  state.runId = net.run?.id ?? null;
  showRun(net);
  const run = `/v1/public/runs/${state.runId}`;
  const [progress, throughput, timing, islands] = state.runId
    ? await Promise.all([get(`${run}/progress`), get(`${run}/throughput?minutes=60&bucket_s=60`), get(`${run}/step-timing?limit=100`), get(`${run}/islands`)])
    : [{ steps: [], evaluations: [] }, [], [], []];
  const search = document.getElementById("search");
  const focused = document.activeElement === search;
  const input = h("input", { id: "search", type: "search", placeholder: "0x…", autocomplete: "off", value: state.search,
    oninput: (e) => { state.search = e.target.value; renderTable(); } });
  view.replaceChildren(
    h("section", { "aria-labelledby": "status-title" }, h("h2", { id: "status-title" }, "Network status"), statusPanel(net)),
    h("section", { "aria-labelledby": "charts-title" }, h("h2", { id: "charts-title" }, "Training"),
      progress.learning?.stalled ? h("p", { class: "alert", id: "learning-stalled", role: "alert" }, progress.learning.stalled) : "",
      charts(progress, throughput, timing, net.run)),
    islands.length ? islandsSection(islands) : "",
    h("section", { "aria-labelledby": "board-title" },
      h("h2", { id: "board-title" }, "Leaderboard"),
      h("label", { for: "search" }, "Search by address"), input,
      h("div", { class: "table-wrap", id: "table-wrap" }, leaderboardTable(rows))),
    h("section", { "aria-labelledby": "validators-title" },
      h("h2", { id: "validators-title" }, "Validators"), h("div", { class: "table-wrap" }, validatorsTable(validators))),
    settlement.chain.enabled ? settlementSection(settlement) : "",
  );
  if (focused) { input.focus(); input.setSelectionRange(input.value.length, input.value.length); }
}

// ---- a node's receipts ------------------------------------------------------------------------

function checksCell(id, checks) {
  if (!checks) return h("td", { class: "muted" }, "not checked yet");
  const failed = checks.filter((c) => c.passed === false);
  // Refreshes rebuild the table: remember which receipts the reader opened.
  const toggled = (e) => (e.target.open ? openChecks.add(id) : openChecks.delete(id));
  return h("td", {}, h("details", { open: openChecks.has(id) ? "" : null, ontoggle: toggled },
    h("summary", {}, failed.length ? `${failed.length} failed` : `all ${checks.length} passed`),
    h("ul", {}, checks.map((c) => h("li", { class: c.passed === false ? "check-failed" : "" },
      `${c.name}: ${c.passed === null ? "skipped" : c.passed ? "passed" : "failed"}${c.reason ? ` (${c.reason})` : ""}`)))));
}

const openChecks = new Set();

function verdictsCell(receipt) {
  // Each verdict: who judged, why it was asked for, what it said, and that validator's agreement rate.
  const items = receipt.verdicts.map((v) => h("li", { class: v.voided ? "muted" : v.agreed === false ? "check-failed" : "" },
    `${fmt.short(v.validator)} (${v.purpose.replace("_", " ")}): ${v.outcome}`,
    v.agreement_rate === null ? "" : `, agrees ${fmt.pct(v.agreement_rate)}`, v.voided ? ", voided" : ""));
  const appeal = receipt.appeal ? h("p", {}, `Appeal ${receipt.appeal.status}`) : "";
  return items.length ? [h("ul", { class: "verdicts" }, items), appeal] : h("span", { class: "muted" }, "none yet");
}

async function showNode(view, address) {
  const [net, node, receipts] = await Promise.all([
    get("/v1/public/network"), get(`/v1/public/nodes/${address}`), get(`/v1/public/submissions?address=${address}&limit=200`),
  ]);
  showRun(net);
  const stats = h("dl", { class: "stats" },
    ...[["Status", node.status], ["Final credit", fmt.credit(node.credit.final)], ["Pending credit", fmt.credit(node.credit.pending)],
      ["Accepted", fmt.num(node.submissions.accepted ?? 0)], ["Rejected", fmt.num((node.submissions.rejected ?? 0) + (node.submissions.invalidated ?? 0))],
      ["Expired (stale before checked, no penalty)", fmt.num(node.submissions.expired ?? 0)],
      ["Last seen", fmt.ago(node.last_seen)]].map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))));
  const rows = receipts.map((r) => h("tr", {},
    h("td", {}, h("a", { href: `/v1/public/submissions/${r.submission_id}`, class: "address" }, fmt.short(r.submission_id))),
    h("td", { class: `status-${r.status}` }, r.status, r.hard ? " (hard)" : "", r.held ? " (held: waiting for an independent validator)" : "",
      // Why it failed or expired, in plain sight: the checks' details stay one click away.
      r.status === "accepted" || r.status === "pending" || !r.reason ? "" : h("p", { class: "reason" }, r.reason)),
    checksCell(r.submission_id, r.checks),
    h("td", {}, verdictsCell(r)),
    h("td", { class: "num" }, fmt.credit(r.credit)),
    h("td", { class: "wide" }, fmt.time(r.created_at)),
    h("td", { class: "wide" }, fmt.time(r.validated_at)),
  ));
  view.replaceChildren(
    h("p", {}, h("a", { href: "#/" }, "← Leaderboard")),
    h("h2", {}, "Node ", h("span", { class: "address" }, node.address)),
    stats,
    h("h2", {}, "Receipts"),
    h("div", { class: "table-wrap" }, h("table", { id: "receipts" },
      h("caption", {}, `The newest ${receipts.length} submissions with each check's result and reason`),
      h("thead", {}, h("tr", {}, ["Submission", "Status", "Checks", "Verdicts", "Credit", "Uploaded", "Validated"].map((t, i) =>
        h("th", { scope: "col", class: i === 4 ? "num" : i > 4 ? "wide" : "" }, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 7 }, "No submissions yet."))))),
  );
}

// ---- routing and refresh --------------------------------------------------------------------

let showing = "";
async function render() {
  const view = document.getElementById("view");
  const route = location.hash.replace(/^#/, "") || "/";
  const match = route.match(/^\/node\/(0x[0-9a-fA-F]{40})$/);
  try {
    if (match) await showNode(view, match[1]);
    else await showLeaderboard(view);
    if (showing !== route) { showing = route; window.scrollTo(0, 0); }
    document.getElementById("updated").textContent = new Date().toLocaleTimeString();
  } catch (e) {
    view.replaceChildren(h("p", { role: "alert" }, `Could not load: ${e.message}`));
  }
}

window.addEventListener("hashchange", render);
render();
setInterval(() => { if (!document.hidden) render(); }, REFRESH_MS);
