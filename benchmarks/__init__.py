"""Benchmarks of the search layouts: inline (legacy 21), external content (head) and variants.

`pytest benchmarks` runs them with pytest-benchmark (`--benchmark-disable` for a smoke run);
`python -m benchmarks.report` measures every figure directly and writes a Markdown report.
"""
