"""Search latency per query class (with snippets and context), and parity with inline."""

from __future__ import annotations

import pytest

from benchmarks import layouts, workloads
from hermes_store.search import accept_search_objects


@pytest.fixture(scope="module")
def connections(store_set):
    engines = {layout: workloads.engine_for(store_set.base(layout)) for layout in layouts.LAYOUTS}
    conns = {layout: engine.connect() for layout, engine in engines.items()}
    for layout in layouts.VARIANTS:  # deliberately not this package's trigram index
        accept_search_objects(conns[layout])
    yield conns
    for conn in conns.values():
        conn.close()
    for engine in engines.values():
        engine.dispose()


def _expects_markers(query_class, layout):
    """True / False when every query of the class must / must not get FTS highlights."""
    if query_class == "LIKE fallback":
        return False
    if query_class == "trigram CJK":
        # detail=column answers one-trigram queries itself and falls back to LIKE for
        # longer ones (phrase queries need detail=full): either can happen.
        return {layouts.DETAIL_COLUMN: None, layouts.NO_TRIGRAM: False}.get(layout, True)
    return True


@pytest.mark.parametrize("query_class", list(workloads.QUERY_CLASSES))
@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_search(benchmark, connections, layout, query_class):
    conn = connections[layout]
    queries = workloads.QUERY_CLASSES[query_class]

    def run():
        return [workloads.timed_search(conn, query)[1] for query in queries]

    answers = benchmark(run)
    assert any(answers), f"{layout}: no query of {query_class!r} found anything"
    markers = _expects_markers(query_class, layout)
    for query, hits in zip(queries, answers, strict=True):
        if layout == layouts.NOTOOL and query_class == "trigram CJK":
            # This variant does not index tool output: fewer (maybe no) hits, none a tool's.
            assert all(hit["role"] != "tool" for hit in hits), query
            continue
        assert hits, f"{layout}: {query!r} found nothing"
        snippets = [hit["snippet"] or "" for hit in hits]
        # The LIKE scan's snippet is substr(content, ...): NULL for a match in tool_calls only.
        assert any(snippets), f"{layout}: {query!r} without snippet"
        assert all(hit["context"] for hit in hits)
        if markers is True:  # an FTS snippet, with highlights
            assert any(">>>" in snippet for snippet in snippets), (layout, query)
        elif markers is False:  # the LIKE scan's substr() snippet
            assert not any(">>>" in snippet for snippet in snippets), (layout, query)
    benchmark.extra_info.update(queries=len(queries))


@pytest.mark.parametrize("layout", layouts.LAYOUTS[1:])
def test_parity_with_inline(store_set, parity_queries, inline_answers, layout):
    answers = workloads.parity_answers(store_set.base(layout), parity_queries)
    parity = workloads.compare_answers(inline_answers, answers)
    assert parity.queries == len(parity_queries)
    assert parity.with_hits > parity.queries // 2  # the comparison is not vacuous
    if layout in layouts.MIGRATION_TARGETS:
        differing = [parity_queries[i] for i in parity.differing]
        assert not differing, f"{layout} answers differently: {differing[:5]}"


#: Queries that used to stall search (issue 15): repeated terms FTS5 evaluates once per
#: repeat, and hundreds of short CJK tokens on the LIKE route. Each must stay bounded: the
#: slowest is recorded (extra_info["slowest_s"]); the target is under 2 s at 50k messages.
def _short_cjk(count):
    return " ".join(chr(0x4E00 + 2 * i) + chr(0x4E01 + 2 * i) for i in range(count))


HOSTILE_QUERIES = {
    "the x200": " ".join(["the"] * 200),
    "a* x80": " ".join(["a*"] * 80),
    "the x340 OR": " OR ".join(["the"] * 340),
    "32 distinct OR": " OR ".join(
        [
            "the",
            "a",
            "to",
            "of",
            "and",
            "in",
            "is",
            "it",
            "for",
            "on",
            "with",
            "as",
            "at",
            "by",
            "from",
            "this",
            "that",
            "be",
            "are",
            "was",
            "error",
            "docker",
            "file",
            "test",
            "run",
            "code",
            "data",
            "user",
            "system",
            "value",
            "line",
        ]
    ),
    "340 short CJK": _short_cjk(340),
    "682 short CJK": _short_cjk(682),
}


@pytest.mark.parametrize("layout", [layouts.EXTERNAL])
def test_search_bounds(benchmark, connections, layout):
    conn = connections[layout]
    slowest = {}

    def run():
        for name, query in HOSTILE_QUERIES.items():
            seconds, _hits = workloads.timed_search(conn, query)
            slowest[name] = max(slowest.get(name, 0.0), seconds)

    benchmark(run)
    benchmark.extra_info["slowest_s"] = round(max(slowest.values()), 3)
    benchmark.extra_info["per_query_s"] = {name: round(s, 3) for name, s in slowest.items()}
