"""``report.html``: one self-contained page per results directory.

It reads what the run wrote (``summary.json``, ``rounds.jsonl``, ``config.json``) and
draws, with inline SVG and no external file, script or font:

- test accuracy over rounds;
- each client's cumulative ε over rounds (private runs only: a non-private run has no ε,
  and the page says so instead of drawing an empty plot);
- per-client budget bars: spent and remaining of each finite budget;
- the client table with each client's guarantee sentence and what its ε does not cover;
- the run's configuration;
- where ``privet audit --out`` added one, the empirical audit: per mechanism the game, the
  canaries, the confidence, the lower bound on ε, the one-shot estimate, the ε charged and the
  flag (:func:`audit_section`; a folder with an audit alone gets a page with that section only).

A small inline script counts, once the page is laid out, the figures that have a
non-empty drawing and the table rows, and writes the counts into ``<body data-...>``:
``tests/server/test_report_html.py`` reads them from a headless Chromium.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
     color:#1d2330;padding:0 1rem;line-height:1.45}
h1{font-size:1.5rem;margin-bottom:.2rem} h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #dde;
     padding-bottom:.2rem}
.sub{color:#566} .cards{display:flex;flex-wrap:wrap;gap:.8rem;margin:1rem 0}
.card{background:#f4f6fa;border-radius:8px;padding:.6rem 1rem;min-width:9rem}
.card b{display:block;font-size:1.3rem}
.figs{display:flex;flex-wrap:wrap;gap:1.5rem} figure{margin:0} figcaption{font-size:.85rem;color:#566}
table{border-collapse:collapse;font-size:.85rem;width:100%} th,td{border-bottom:1px solid #e4e7ee;
     padding:.3rem .5rem;text-align:left;vertical-align:top} th{background:#f4f6fa}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.no{color:#b00020;font-weight:600} .note{background:#fff8e1;border-left:4px solid #f0b400;
     padding:.5rem .8rem;margin:1rem 0} .muted{color:#889}
svg text{font-size:11px;fill:#334} .legend{font-size:.8rem}
"""

CHECK_SCRIPT = """
window.addEventListener('load', function () {
  var figs = document.querySelectorAll('figure[data-figure] svg');
  var drawn = 0;
  figs.forEach(function (svg) {
    var marks = svg.querySelectorAll('.mark');
    var ok = marks.length > 0;
    marks.forEach(function (m) { var b = m.getBBox(); if (!(b.width > 0 || b.height > 0)) ok = false; });
    if (ok && svg.getBoundingClientRect().width > 0) drawn += 1;
  });
  var rows = document.querySelectorAll('table[data-table] tbody tr').length;
  document.body.dataset.figures = String(figs.length);
  document.body.dataset.figuresDrawn = String(drawn);
  document.body.dataset.tables = String(document.querySelectorAll('table[data-table]').length);
  document.body.dataset.tableRows = String(rows);
  document.body.dataset.rendered = 'yes';
});
"""



#: Above this many clients the ε figure shows max and mean instead of one line per client.
MAX_CLIENT_SERIES = 20

def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(x: Any, digits: int = 4) -> str:
    if x is None:
        return "∞"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return _e(x)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round-number ticks covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start, stop = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 10) for k in range(start, stop + 1)]


def line_chart(series: Sequence[tuple[str, Sequence[tuple[float, float]]]], *, x_label: str, y_label: str,
               width: int = 500, height: int = 280, y_min: float | None = None) -> str:
    """An SVG line chart: one polyline with point marks per series, integer x ticks."""
    points = [p for _, pts in series for p in pts]
    left, right, top, bottom = 55, 15, 15, 40
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    yt = _ticks(min(ys) if y_min is None else min(y_min, min(ys)), max(ys))
    y0, y1 = yt[0], yt[-1]
    if y1 == y0:
        y1 = y0 + 1

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img">')]
    for t in yt:
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e4e7ee"/>'
                   f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    step = max(1, math.ceil((x1 - x0) / 10))
    for k in range(math.ceil(x0), math.floor(x1) + 1, step):
        out.append(f'<text x="{px(k):.1f}" y="{height - bottom + 16}" text-anchor="middle">{k}</text>')
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{height - bottom}" y2="{height - bottom}" stroke="#889"/>'
               f'<line x1="{left}" x2="{left}" y1="{top}" y2="{height - bottom}" stroke="#889"/>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 6}" text-anchor="middle">{_e(x_label)}</text>'
               f'<text transform="translate(14 {(top + height - bottom) / 2}) rotate(-90)" '
               f'text-anchor="middle">{_e(y_label)}</text>')
    for i, (name, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        if len(pts) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
            out.append(f'<polyline class="mark" points="{path}" fill="none" stroke="{color}" stroke-width="2">'
                       f'<title>{_e(name)}</title></polyline>')
        for x, y in pts:
            out.append(f'<circle class="mark" cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}">'
                       f'<title>{_e(name)}: round {x:g}, {y:.4f}</title></circle>')
    out.append("</svg>")
    if len(series) > 1:
        out.append('<div class="legend">' + " ".join(
            f'<span style="color:{PALETTE[i % len(PALETTE)]}">&#9632;</span> {_e(name)}'
            for i, (name, _) in enumerate(series)) + "</div>")
    return "".join(out)


def budget_bars(clients: Sequence[dict[str, Any]], width: int = 500) -> str:
    """Horizontal bars: each finite budget, its spent part filled, the rest outlined."""
    rows = [c for c in clients if c.get("epsilon_budget") is not None]
    bar_h, gap, left, right, top = 16, 6, 70, 150, 8
    height = top + len(rows) * (bar_h + gap) + 24
    scale = max(c["epsilon_budget"] for c in rows)
    inner = width - left - right
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img">')]
    for i, c in enumerate(rows):
        y = top + i * (bar_h + gap)
        budget, spent = c["epsilon_budget"], min(c.get("epsilon_spent") or 0.0, c["epsilon_budget"])
        wb, ws = budget / scale * inner, spent / scale * inner
        color = "#d62728" if not c.get("within_budget", True) else "#1f77b4"
        remaining = max(budget - (c.get("epsilon_spent") or 0.0), 0.0)
        out.append(
            f'<text x="{left - 6}" y="{y + 12}" text-anchor="end">client {_e(c["client_id"])}</text>'
            f'<rect x="{left}" y="{y}" width="{wb:.1f}" height="{bar_h}" fill="#fff" stroke="{color}"/>'
            f'<rect class="mark" x="{left}" y="{y}" width="{max(ws, 0.5):.1f}" height="{bar_h}" fill="{color}">'
            f'<title>client {_e(c["client_id"])}: spent {spent:.4f} of {budget:.4f}</title></rect>'
            f'<text x="{left + wb + 6:.1f}" y="{y + 12}">{spent:.3f} / {budget:.3f} '
            f'(left {remaining:.3f})</text>')
    out.append(f'<text x="{left}" y="{height - 6}">filled: ε spent; outline: budget (same scale)</text></svg>')
    return "".join(out)


def read_results(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """``summary.json``, the lines of ``rounds.jsonl`` and ``config.json`` of a results directory."""
    summary = json.loads((out / "summary.json").read_text())
    rounds_path = out / "rounds.jsonl"
    rounds = [json.loads(l) for l in rounds_path.read_text().splitlines() if l.strip()] if rounds_path.exists() else []
    config_path = out / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    return summary, rounds, config


def is_private(summary: dict[str, Any]) -> bool:
    """Whether any client holds a finite ε (a non-private run has none)."""
    return summary.get("dp_mode") != "none" and any(c.get("epsilon_budget") is not None for c in summary["clients"])


def _within(c: dict[str, Any]) -> str:
    if c.get("epsilon_budget") is None:
        return '<span class="muted">n/a (no budget)</span>'
    return "yes" if c.get("within_budget") else '<span class="no">NO</span>'


def _noise(summary: dict[str, Any]) -> str:
    if summary.get("dp_mode") == "none":
        return "none (non-private)"
    nm = summary.get("noise_multiplier")
    return _e(nm) if isinstance(nm, str) else f"σ = {nm:g}"


def audit_section(audit: dict[str, Any]) -> list[str]:
    """The "Empirical privacy audit" section (``summary.json``'s ``audit``, :func:`server.results.write_audit`)."""
    from server.audit_text import AUDIT_STATEMENT, audit_figure

    p = [f'<h2 id="audit">Empirical privacy audit (client {_e(audit["client"])})</h2>',
         f'<p class="sub">{_e(audit["strategy"])}, dp-mode {_e(audit["dp_mode"])}, client {_e(audit["client"])} '
         f"(budget ε = {_e(audit_figure(audit['epsilon_budget']))}): canaries through privet's own client "
         f"mechanisms, calibration and ledger (<code>privet audit</code>); every figure in "
         f"<code>{_e(audit['details'])}</code>.</p>"]
    flagged = [m for m in audit["mechanisms"] if m["flagged"]]
    p += [f'<div class="note no">{_e(m["line"])}</div>' for m in flagged]
    if audit["mechanisms"]:
        head = ["game", "level", "mechanism", "canaries", "confidence", "lower bound ε", "one-shot estimate ε",
                "ε charged", "δ", "flagged", "observes"]
        p.append('<table data-table="audit"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head)
                 + "</tr></thead><tbody>")
        for m in audit["mechanisms"]:
            cells = [_e(m["game"]), _e(m["level"]), _e(m["mechanism"]), _e(m["canaries"]), f"{m['confidence']:g}",
                     _e(audit_figure(m["lower_bound"])), _e(audit_figure(m["one_shot_epsilon"])),
                     _e(audit_figure(m["charged_epsilon"])), f"{m['delta']:g}",
                     '<span class="no">FLAGGED</span>' if m["flagged"] else "no", _e(m["observes"])]
            p.append("<tr>" + "".join(f'<td class="num">{x}</td>' if 3 <= i <= 8 else f"<td>{x}</td>"
                                      for i, x in enumerate(cells)) + "</tr>")
        p.append("</tbody></table>")
    else:
        p.append("<p>No mechanism was audited.</p>")
    if audit["not_audited"]:
        p.append("<ul>" + "".join(f"<li>not audited: {_e(w)}</li>" for w in audit["not_audited"]) + "</ul>")
    p.append(f'<p class="muted">{_e(AUDIT_STATEMENT)}</p>')
    return p


def _audit_page(audit: dict[str, Any], title: str) -> str:
    """A folder with an audit and no run: the audit section alone."""
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>privet audit: {_e(audit['strategy'])}{(' - ' + _e(title)) if title else ''}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>privet audit: {_e(audit['strategy'])} ({_e(audit['dp_mode'])})</h1>",
        *audit_section(audit), f"<script>{CHECK_SCRIPT}</script></body></html>"])


def render(summary: dict[str, Any], rounds: list[dict[str, Any]], config: dict[str, Any], title: str = "") -> str:
    """The whole page as a string (a run's, with its audit where it has one; or an audit's alone)."""
    if "clients" not in summary:
        return _audit_page(summary["audit"], title)
    private = is_private(summary)
    acc = [(r["round"], r["accuracy"]) for r in rounds if r.get("accuracy") is not None]
    figures = []
    if acc:
        figures.append(("accuracy", "Test accuracy of the global model by round (round 0: the initial model)",
                        line_chart([("test accuracy", acc)], x_label="round", y_label="test accuracy")))
    eps_series: dict[str, list[tuple[float, float]]] = {}
    for r in rounds:
        for cid, v in (r.get("epsilon_spent") or {}).items():
            if v is not None and math.isfinite(v):
                eps_series.setdefault(str(cid), []).append((r["round"], v))
    if private and eps_series and len(eps_series) <= MAX_CLIENT_SERIES:
        ordered = sorted(eps_series.items(), key=lambda kv: (len(kv[0]), kv[0]))
        figures.append(("epsilon", "Cumulative ε spent by each client (its own ledger, replace-one), "
                        "at the rounds it trained",
                        line_chart([(f"client {k}", v) for k, v in ordered], x_label="round",
                                   y_label="cumulative ε spent", y_min=0.0)))
    elif private:  # too many clients for one line each: the statistics every round row carries
        stats = [r for r in rounds if r.get("num_registered")]
        figures.append(("epsilon", f"Cumulative ε spent over the {len(summary['clients'])} clients "
                        "(their own ledgers, replace-one)",
                        line_chart([("max", [(r["round"], r["epsilon_spent_max"]) for r in stats]),
                                    ("mean", [(r["round"], r["epsilon_spent_mean"]) for r in stats])],
                                   x_label="round", y_label="cumulative ε spent", y_min=0.0)))
    if private:
        figures.append(("budgets", "Per-client budget: spent and remaining", budget_bars(summary["clients"])))

    cards = [
        ("final test accuracy", _num(summary.get("final_accuracy"))),
        ("best test accuracy", _num(summary.get("best_accuracy"))),
        ("rounds", f"{summary.get('rounds_completed')}/{summary.get('rounds')}"),
        ("clients", str(len(summary["clients"]))),
    ]
    if summary.get("final_personalized_accuracy") is not None:
        cards.insert(1, ("personal models", _num(summary["final_personalized_accuracy"])))
    if private:
        spent = [c["epsilon_spent"] for c in summary["clients"] if c.get("epsilon_spent") is not None]
        if spent:
            cards.append(("max ε spent", f"{max(spent):.3f}"))
        over = [c for c in summary["clients"] if c.get("epsilon_budget") is not None and not c.get("within_budget")]
        cards.append(("clients over budget", str(len(over))))
    else:
        cards.append(("privacy", "none"))

    p = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>privet report: {_e(summary['strategy'])}{(' - ' + _e(title)) if title else ''}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>privet run: {_e(summary['strategy'])} ({_e(summary.get('dp_mode'))})</h1>",
        (f'<div class="sub">{_e(summary.get("dataset"))}, model {_e(summary.get("model"))}, '
         f"accountant {_e(summary.get('accountant'))}, clip {_e(summary.get('clip'))}, noise {_noise(summary)}; "
         f"status: {_e(summary.get('status', 'completed'))}; {summary.get('elapsed_seconds', 0):.0f} s"
         f"{(' - ' + _e(title)) if title else ''}</div>"),
        '<div class="cards">' + "".join(f'<div class="card">{_e(k)}<b>{v}</b></div>' for k, v in cards) + "</div>",
    ]
    if not private:
        p.append('<div class="note">This run is <b>not private</b>: clients trained without differential '
                 "privacy, so no ε is spent or bounded and no budget applies. The server saw every update in "
                 "the clear.</div>")
    p.append('<h2>Over the rounds</h2><div class="figs">')
    for key, caption, svg in figures:
        p.append(f'<figure data-figure="{key}">{svg}<figcaption>{_e(caption)}</figcaption></figure>')
    p.append("</div>")

    # ------------------------------------------------------------- clients
    p.append("<h2>Clients</h2>")
    head = ["client", "budget ε", "spent ε", "remaining ε", "before run", "server check", "δ", "examples",
            "rounds", "dropped", "rejected", "within budget"]
    p.append('<table data-table="clients"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head)
             + "</tr></thead><tbody>")
    for c in summary["clients"]:
        budget, spent = c.get("epsilon_budget"), c.get("epsilon_spent")
        remaining = (max(budget - (spent or 0.0), 0.0) if budget is not None else None)
        cells = [
            _e(c["client_id"]), _num(budget) if private else "none", _num(spent) if budget is not None else "-",
            _num(remaining) if budget is not None else "-",
            _num(c.get("epsilon_spent_before_run")) if budget is not None else "-",
            _num(c.get("epsilon_server_recomputed_this_run")) if budget is not None else "-",
            f"{c.get('delta', 0):g}" if budget is not None else "-", _e(c.get("num_examples")),
            str(len(c.get("rounds_joined", []))), str(len(c.get("dropped_rounds", []))),
            str(len(c.get("rejections", []))), _within(c),
        ]
        p.append("<tr>" + "".join(f'<td class="num">{x}</td>' if i else f"<td>{x}</td>"
                                  for i, x in enumerate(cells)) + "</tr>")
    p.append("</tbody></table>")

    # ---------------------------------------------------------- guarantees
    p.append("<h2>What each client's ε guarantees</h2>")
    groups: dict[str, list[str]] = {}
    for c in summary["clients"]:
        groups.setdefault(c.get("guarantee", "unknown"), []).append(str(c["client_id"]))
    p.append('<table data-table="guarantees"><thead><tr><th>clients</th><th>guarantee</th><th>relation</th>'
             "<th>noise source</th></tr></thead><tbody>")
    for text, ids in groups.items():
        first = next(c for c in summary["clients"] if str(c["client_id"]) == ids[0])
        p.append(f"<tr><td>{_e(', '.join(ids))}</td><td>{_e(text)}</td><td>{_e(first.get('relation', ''))}</td>"
                 f"<td>{_e(first.get('noise_source', ''))}</td></tr>")
    p.append("</tbody></table>")
    uncovered = [(c["client_id"], w) for c in summary["clients"] for w in c.get("not_covered", [])]
    rejected = [(c["client_id"], r) for c in summary["clients"] for r in c.get("rejections", [])]
    p.append("<h3>Not covered by any client's ε</h3><ul>")
    p += [f"<li>client {_e(cid)}: {_e(w)}</li>" for cid, w in uncovered]
    p.append("<li>every reply also carries the client's example count, budget, δ and spent ε, and the "
             "mechanism's σ, q and step count: functions of public figures only;</li>"
             "<li>secure aggregation is not used: the server sees every upload;</li>"
             "<li>floating-point attacks on the Gaussian sampler are not countered.</li></ul>")
    if rejected:
        p.append("<h3>Rejected replies</h3><ul>")
        p += [f"<li>round {_e(r['round'])}: client {_e(cid)}: {_e(r['reason'])}</li>" for cid, r in rejected]
        p.append("</ul>")
    if summary.get("refused"):
        p.append("<h3>Sites refused at the handshake (never scheduled, no budget spent here)</h3><ul>")
        p += [f"<li>{_e(r.get('client_id'))} (node {_e(r.get('node_id'))}): {_e(r.get('reason'))}</li>"
              for r in summary["refused"]]
        p.append("</ul>")
    if summary.get("failed_rounds"):
        p.append("<h3>Failed rounds (no new global model)</h3><ul>")
        p += [f"<li>round {_e(f.get('round'))}: {_e(f.get('reason'))}</li>" for f in summary["failed_rounds"]]
        p.append("</ul>")

    if summary.get("audit"):
        p += audit_section(summary["audit"])

    # -------------------------------------------------------------- config
    if config:
        p.append('<h2>Configuration</h2><table data-table="config"><thead><tr><th>key</th><th>value</th>'
                 "</tr></thead><tbody>")
        for k, v in _flat(config).items():
            p.append(f"<tr><td><code>{_e(k)}</code></td><td>{_e(json.dumps(v))}</td></tr>")
        p.append("</tbody></table>")
    p.append(f"<script>{CHECK_SCRIPT}</script></body></html>")
    return "\n".join(p)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def write_report(out: str | Path) -> Path:
    """Write ``<out>/report.html`` from the results files; return its path."""
    out = Path(out)
    summary, rounds, config = read_results(out)
    path = out / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render(summary, rounds, config, title=out.name), encoding="utf-8")
    tmp.replace(path)
    return path
