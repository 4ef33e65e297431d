"""The many-writers report (``benchmarks/many_writers.py``): Markdown, ratios and chart.

Everything here reads the JSON-ready results dict only, so ``--render-only`` redraws any
earlier run's ``many_writers.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.many_writers_procs import BUSY, OTHER, log

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
BACKENDS = (SQLITE, POSTGRESQL)
LABELS = {SQLITE: "SQLite", POSTGRESQL: "PostgreSQL"}
#: Issue 26's target: with this many writers, PostgreSQL's search p50 at most this many
#: times SQLite's, in the same run.
TARGET_WRITERS = 8
SEARCH_P50_MAX_RATIO = 2.0


def _cells(results: dict[str, Any], backend: str) -> dict[int, dict[str, Any]]:
    return {c["writers"]: c for c in results["cells"] if c["backend"] == backend}


def _rate(results: dict[str, Any]) -> float | None:
    """Each writer's appends per second when the run was paced (``--rate``), else None
    (also for a run from before ``--rate``)."""
    rate = results.get("meta", {}).get("rate")
    return None if rate is None else float(rate)


def crossover(results: dict[str, Any]) -> str:
    """One sentence: from which writer count PostgreSQL's throughput passes SQLite's (a
    paced run's throughput is the load asked: then it says so instead)."""
    lite, pg = _cells(results, SQLITE), _cells(results, POSTGRESQL)
    if not lite or not pg:
        missing = results["not_measured"].get(POSTGRESQL) or results["not_measured"].get(SQLITE)
        return f"No comparison: PostgreSQL not measured ({missing})." if missing else ""
    rate = _rate(results)
    if rate is not None:
        return (
            f"Writers paced at {rate:g} appends/s each: appends/s is the load asked, not "
            "what a database sustains (a run without --rate measures that)."
        )
    counts = sorted(set(lite) & set(pg))
    ahead = [n for n in counts if pg[n]["appends_per_s"] > lite[n]["appends_per_s"]]

    def pair(n: int) -> str:
        return (
            f"{pg[n]['appends_per_s']:.0f} against {lite[n]['appends_per_s']:.0f} appends/s "
            f"at {n} writer{'s' if n > 1 else ''}"
        )

    if not ahead:
        best = max(counts, key=lambda n: pg[n]["appends_per_s"] / lite[n]["appends_per_s"])
        return (
            f"PostgreSQL does not overtake SQLite in append throughput at any writer count "
            f"measured; it comes closest with {pair(best)}."
        )
    first = ahead[0]
    stays = all(n in ahead for n in counts if n >= first)
    sentence = (
        f"PostgreSQL overtakes SQLite in append throughput from {first} writers: {pair(first)}"
    )
    if first == counts[0]:
        sentence = (
            "PostgreSQL is ahead of SQLite in append throughput at every writer count: "
            + pair(first)
        )
    if first != counts[-1]:
        sentence += f", and {pair(counts[-1])}"
    return sentence + ("." if stays else " (not at every count above it).")


def _searched(results: dict[str, Any]) -> bool | None:
    """Whether the cells ran a searcher (None when there are no cells)."""
    if not results["cells"]:
        return None
    return any(cell["search"] for cell in results["cells"])


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _errors(counts: dict[str, int]) -> str:
    return f"{counts[BUSY]} / {counts[OTHER]}"


def _kept_up(pace: dict[str, Any]) -> str:
    share = f"{pace['achieved_share'] * 100:.1f}%"
    if pace["kept_up"]:
        return f"yes, {share}"
    return f"NO, {share}, {pace['missed']:,} missed"


def _pace_columns(cell: dict[str, Any]) -> str:
    """A paced cell's asked rate, achieved rate, verdict, and how far behind it fell."""
    pace = cell["pace"]
    return (
        f"| {_num(pace['asked_per_s'], 0)} | {_num(cell['appends_per_s'], 0)} "
        f"| {_kept_up(pace)} "
        f"| {_num(pace['behind_p99_ms'], 1)} / {_num(pace['behind_max_ms'], 1)} "
    )


def table(results: dict[str, Any]) -> list[str]:
    """The Markdown table: one row per writer count and database (a paced run's with the
    load asked, the load achieved, whether the writers kept up and how far behind)."""
    paced = _rate(results) is not None
    rate_header = (
        "| asked appends/s | appends/s | kept up | behind p99 / max (ms) "
        if paced
        else "| appends/s "
    )
    header = (
        "| writers | database " + rate_header + "| append p50 (ms) | append p99 (ms) "
        "| errors busy / other | rewinds | searches/s | search p50 (ms) | search p99 (ms) "
        "| rows checked |"
    )
    columns = header.count("|") - 1
    lines = [header, "|" + "---|" * columns]
    backends = [b for b in BACKENDS if _cells(results, b)]
    writer_counts = sorted({c["writers"] for c in results["cells"]})
    for writers in writer_counts:
        for backend in backends:
            cell = _cells(results, backend).get(writers)
            if cell is None:
                continue
            search = cell["search"]
            checked = cell["verified"]
            ok = not (
                checked["lost"]
                or checked["unexpected"]
                or checked["counters_wrong"]
                or checked["rewind_wrong"]
            )
            rates = _pace_columns(cell) if paced else f"| {_num(cell['appends_per_s'], 0)} "
            lines.append(
                f"| {writers} | {LABELS[backend]} {rates}"
                f"| {_num(cell['append_p50_ms'], 2)} | {_num(cell['append_p99_ms'], 2)} "
                f"| {_errors(cell['errors'])} | {cell['rewinds']} "
                f"| {_num(search['per_s']) if search else 'not run'} "
                f"| {_num(search['p50_ms'], 2) if search else '–'} "
                f"| {_num(search['p99_ms'], 2) if search else '–'} "
                f"| {checked['expected']:,} {'none lost' if ok else 'MISMATCH'} |"
            )
    for backend, reason in results["not_measured"].items():
        lines.append(f"| all | {LABELS[backend]} | not measured: {reason} |" + " |" * (columns - 3))
    return lines


def same_load(results: dict[str, Any]) -> str:
    """A paced run: whether every cell's writers kept up, so that each database's search
    figures are under the same write load; which fell behind if not ("" unpaced)."""
    if _rate(results) is None or not results["cells"]:
        return ""
    share = results["meta"].get("kept_up_share", 0.95)
    behind = [cell for cell in results["cells"] if not cell["pace"]["kept_up"]]
    if not behind:
        return (
            f"Every cell's writers kept up (at least {share:.0%} of the appends asked): "
            "the databases' search figures are under the same write load."
        )
    cells = "; ".join(
        f"{LABELS[c['backend']]} with {c['writers']} writers made "
        f"{c['pace']['achieved_share']:.0%} of {c['pace']['asked_per_s']:,.0f} appends/s "
        f"({c['pace']['missed']:,} slots missed, at most {_num(c['pace']['behind_max_ms'], 0)} "
        "ms behind)"
        for c in behind
    )
    return (
        f"Not the same write load where the writers fell behind (under {share:.0%} of the "
        f"appends asked): {cells}. Compare search there with care, or lower --rate."
    )


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """PostgreSQL's figures over SQLite's, per writer count measured on both."""
    lite, pg = _cells(results, SQLITE), _cells(results, POSTGRESQL)
    rows: list[dict[str, Any]] = []
    for writers in sorted(set(lite) & set(pg)):
        a, b = lite[writers], pg[writers]
        row: dict[str, Any] = {
            "writers": writers,
            "appends_per_s": _ratio(b["appends_per_s"], a["appends_per_s"]),
            "append_p50_ms": _ratio(b["append_p50_ms"], a["append_p50_ms"]),
            "append_p99_ms": _ratio(b["append_p99_ms"], a["append_p99_ms"]),
            "search_p50_ms": None,
            "search_p99_ms": None,
        }
        if a["search"] and b["search"]:
            row["search_p50_ms"] = _ratio(b["search"]["p50_ms"], a["search"]["p50_ms"])
            row["search_p99_ms"] = _ratio(b["search"]["p99_ms"], a["search"]["p99_ms"])
        rows.append(row)
    return rows


def search_target(results: dict[str, Any]) -> dict[str, Any] | None:
    """Issue 26's target: PostgreSQL's search p50 within SEARCH_P50_MAX_RATIO of SQLite's
    at TARGET_WRITERS writers, in the same run (None when that cell was not run)."""
    row = next((r for r in ratios(results) if r["writers"] == TARGET_WRITERS), None)
    if row is None:
        return None
    value = row["search_p50_ms"]
    return {
        "target": f"search p50 with {TARGET_WRITERS} writers: PostgreSQL / SQLite at most "
        f"{SEARCH_P50_MAX_RATIO:g}x",
        "value": value,
        "p99_ratio": row["search_p99_ms"],
        "passed": None if value is None else value <= SEARCH_P50_MAX_RATIO,
    }


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:,.2f}x"


def ratio_table(results: dict[str, Any]) -> list[str]:
    """PostgreSQL ÷ SQLite per writer count (latencies: above 1 is PostgreSQL slower)."""
    rows = ratios(results)
    if not rows:
        return []
    lines = [
        "| writers | appends/s | append p50 | append p99 | search p50 | search p99 |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['writers']} | {_x(row['appends_per_s'])} | {_x(row['append_p50_ms'])} "
            f"| {_x(row['append_p99_ms'])} | {_x(row['search_p50_ms'])} "
            f"| {_x(row['search_p99_ms'])} |"
        )
    target = search_target(results)
    if target is not None:
        verdict = (
            "not measured" if target["passed"] is None else ("PASS" if target["passed"] else "MISS")
        )
        lines += [
            "",
            f"Target, {target['target']}: {_x(target['value'])} (p99 "
            f"{_x(target['p99_ratio'])}): {verdict}.",
        ]
    return lines


def _loop(meta: dict[str, Any]) -> str:
    """How the writers append: as fast as they can, or paced (and what kept up means)."""
    if meta.get("rate") is None:
        return "as fast as they can"
    rate, catch_up = meta["rate"], meta.get("catch_up", 3)
    return (
        f"at {rate:g} appends/s each, paced (an open loop: append k is due k/{rate:g} s "
        "after the start, whatever the earlier ones took; behind schedule a writer makes at "
        f"most {catch_up + 1} back to back and drops older slots, counted as missed; "
        f"kept up: at least {meta.get('kept_up_share', 0.95):.0%} of the appends asked made "
        "in the window; behind: how late a writer came to a slot)"
    )


def render_markdown(results: dict[str, Any], *, heading: str = "#") -> str:
    meta = results["meta"]
    databases = results["databases"]
    rate = _rate(results)
    lines = [
        f"{heading} Many writers, side by side"
        + ("" if rate is None else f", paced at {rate:g} appends/s per writer"),
        "",
        f"Generated {meta['date']} on {meta['platform']}, {meta['cpus']} CPUs, Python "
        f"{meta['python']}; commit {meta['commit']}; load average before "
        f"{meta['loadavg_before']}, after {meta.get('loadavg_after')}.",
    ]
    if SQLITE in databases:
        lite = databases[SQLITE]
        lines.append(
            f"SQLite {lite['version']}: a file, journal_mode={lite['journal_mode']}, "
            f"synchronous={lite['synchronous']}, busy timeout {lite['busy_timeout_ms']} ms."
        )
    if POSTGRESQL in databases:
        pg = databases[POSTGRESQL]
        lines.append(
            f"PostgreSQL {pg['version']} on the same machine ({pg['server']}), "
            f"synchronous_commit={pg.get('synchronous_commit')}, "
            f"lock_timeout {pg['lock_timeout_ms']} ms."
        )
    lines += [
        "",
        f"Each cell: a copy of one store seeded with {meta['seed_messages']:,} generated "
        f"messages; N writer processes append one message per transaction "
        f"(`Store.append_message`) {_loop(meta)}, a new session every "
        f"{meta['session_length']} messages, and rewind their last {meta['rewind_last']} "
        f"messages every {meta['rewind_every']} appends (`Store.set_message_flags`)"
        + (
            "; no searcher (see below). "
            if _searched(results) is False
            else f"; one more process runs `Store.search` over {len(meta['search_queries'])} "
            "queries in turn. "
        )
        + f"{meta['seconds']:g} s measured after {meta['warmup']:g} s of warm-up. Errors: "
        "busy/locked (a lock not had within the timeout) / other. Rows checked: every "
        "row a writer was given an id for is in its session afterwards, no other row is, "
        "counters and rewound flags agree.",
        "",
        *table(results),
    ]
    ratio_lines = ratio_table(results)
    if ratio_lines:
        lines += ["", "PostgreSQL ÷ SQLite, same run:", "", *ratio_lines]
    if same_load(results):
        lines += ["", same_load(results)]
    for backend, reason in results["search_not_measured"].items():
        lines += ["", f"Searcher on {LABELS[backend]}: not measured: {reason}."]
    samples = [
        f"- {LABELS[c['backend']]}, {c['writers']} writers: {s}"
        for c in results["cells"]
        for s in c["error_samples"] + (c["search"]["error_samples"] if c["search"] else [])
    ]
    if samples:
        lines += ["", "Errors seen:", "", *samples[:10]]
    if results.get("crossover"):
        lines += ["", results["crossover"]]
    if results.get("chart"):
        lines += ["", f"![many writers]({results['chart']})"]
    elif results.get("chart_note"):
        lines += ["", results["chart_note"]]
    return "\n".join(lines) + "\n"


def render_chart(results: dict[str, Any], target: Path) -> bool:
    """Write the PNG chart; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = (
        ("appends/s (all writers)", lambda c: c["appends_per_s"], False),
        ("append p99 (ms, log)", lambda c: c["append_p99_ms"], True),
        (
            "searches/s (one searcher, log)",
            lambda c: c["search"]["per_s"] if c["search"] else None,
            True,
        ),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.6))
    for ax, (title, value, log_scale) in zip(axes, panels, strict=True):
        for backend, style in ((SQLITE, "-o"), (POSTGRESQL, "-s")):
            cells = _cells(results, backend)
            points = [(n, value(c)) for n, c in sorted(cells.items()) if value(c) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=LABELS[backend])
        if not ax.lines:
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("writer processes")
        ax.set_xscale("log", base=2)
        ax.set_xticks(results["meta"]["writers"], [str(n) for n in results["meta"]["writers"]])
        if log_scale:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    searcher = "no searcher" if _searched(results) is False else "one searcher"
    rate = _rate(results)
    if rate is not None:
        searcher += f", writers paced at {rate:g}/s each"
    fig.suptitle(
        f"Many writers, {searcher} ({results['meta']['cpus']} CPUs, "
        f"{results['meta']['seconds']:g} s per cell)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(target, dpi=80)
    plt.close(fig)
    return True


CHART = "many_writers.png"


def attach_chart(results: dict[str, Any], out: Path) -> None:
    """Draw ``out/many_writers.png`` and name it in ``results``, or say why there is none."""
    results.pop("chart", None)
    results.pop("chart_note", None)
    if render_chart(results, out / CHART):
        results["chart"] = CHART
    else:
        results["chart_note"] = (
            "No chart: matplotlib is not installed (`pip install -e '.[chart]'`)."
        )
        log(results["chart_note"])


def write(results: dict[str, Any], out: Path) -> Path:
    """Write many_writers.json, .md and .png (with matplotlib) under ``out``; print the table."""
    out.mkdir(parents=True, exist_ok=True)
    attach_chart(results, out)
    markdown = render_markdown(results)
    (out / "many_writers.md").write_text(markdown, encoding="utf-8")
    (out / "many_writers.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(markdown)
    return out / "many_writers.md"
