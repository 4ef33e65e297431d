"""Bytes per table group after VACUUM (dbstat), per layout."""

from __future__ import annotations

import pytest

from benchmarks import layouts, workloads
from hermes_store.sqlite import storage


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_storage_report(benchmark, store_set, layout):
    path = store_set.base(layout)
    report = benchmark(workloads.storage_of, path)
    # Every page of the main file is counted once: groups plus free pages are the file.
    assert sum(report.groups.values()) + report.free_bytes == report.file_bytes
    assert report.file_bytes == path.stat().st_size
    assert report.freelist_pages == 0  # the base stores are VACUUMed
    copies = report.groups[storage.FTS_COPIES]
    assert (copies > 0) if layout == layouts.INLINE else (copies == 0)
    assert report.groups[storage.MESSAGE_DATA] > 0
    assert report.groups[storage.FTS_INDEX] > 0
    benchmark.extra_info.update(file_bytes=report.file_bytes, **report.groups)


def test_external_size_near_physical_limit(store_set):
    inline = workloads.storage_of(store_set.base(layouts.INLINE))
    external = workloads.storage_of(store_set.base(layouts.EXTERNAL))
    limit = workloads.physical_limit(inline)
    ratio = external.file_bytes / inline.file_bytes
    assert 0.3 < limit < 0.95
    # The target: within 2 percentage points of the physical limit.
    assert abs(ratio - limit) <= 0.02, f"external/inline {ratio:.4f}, limit {limit:.4f}"
    # Only the copies went: the messages and the index data are the same bytes.
    assert external.groups[storage.MESSAGE_DATA] == inline.groups[storage.MESSAGE_DATA]
