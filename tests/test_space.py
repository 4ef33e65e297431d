"""Free space: where SQLite writes its temporary files, and refusing a command up front."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_support import sqlite_temp_directory

from hermes_store.errors import DiskFull, NotEnoughFreeSpace
from hermes_store.sqlite import maintenance, space

#: In a process of its own: where `space.sqlite_temp_dir` says SQLite writes, and where
#: SQLite really opened its temporary file (a temporary table larger than the page cache).
WHERE_SQLITE_WRITES = r"""
import json, os, sqlite3
from hermes_store.sqlite import space
conn = sqlite3.connect(":memory:")
conn.execute("CREATE TEMP TABLE big AS SELECT zeroblob(8192) AS b FROM "
             "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) "
             "SELECT i FROM n)")
opened = []
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if "etilqs_" in target:
        opened.append(os.path.dirname(target))
print(json.dumps({"said": str(space.sqlite_temp_dir()), "opened": opened}))
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see the file")
@pytest.mark.parametrize("variable", ["SQLITE_TMPDIR", "TMPDIR", None])
def test_the_temporary_directory_is_where_sqlite_really_writes(
    variable: str | None, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SQLITE_TMPDIR", "TMPDIR")}
    if variable is not None:
        env[variable] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", WHERE_SQLITE_WRITES],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    seen = json.loads(done.stdout)
    assert seen["opened"], "SQLite kept the temporary table in memory"
    assert {str(Path(d).resolve()) for d in seen["opened"]} == {seen["said"]}
    if variable is not None:
        assert seen["said"] == str(tmp_path.resolve())


def test_the_temporary_directory_pragma_wins(tmp_path: Path) -> None:
    with sqlite_temp_directory(tmp_path / "elsewhere") as directory:
        assert space.sqlite_temp_dir() == directory
    assert space.sqlite_temp_dir() != directory


def _free(mapping: dict[str, int]) -> object:
    real = shutil.disk_usage

    def usage(where: object) -> object:
        return real(where)._replace(free=mapping.get("free", 0))

    return usage


def test_needs_on_one_file_system_add_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    needs = [
        space.Need(tmp_path / "a", 3 << 20, "the log"),
        space.Need(tmp_path / "b", 2 << 20, "the temporary files"),
    ]
    monkeypatch.setattr(shutil, "disk_usage", _free({"free": 6 << 20}))
    space.require_free(needs, task="this step", advice="Free some.", store=None)
    monkeypatch.setattr(shutil, "disk_usage", _free({"free": 4 << 20}))
    with pytest.raises(NotEnoughFreeSpace) as refused:
        space.require_free(needs, task="this step", advice="Free some.", store=tmp_path / "s.db")
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 's.db'}: the disk is full: this step needs about ")
    assert "5.0 MiB free on" in message
    assert "(the log 3.0 MiB + the temporary files 2.0 MiB)" in message
    assert "only 4.0 MiB is free there; nothing was changed. Free some." in message
    assert refused.value.needed == 5 << 20
    assert refused.value.free == 4 << 20
    assert refused.value.where == str(space.mount_point(tmp_path))


def test_one_error_for_a_command_refused_for_lack_of_space() -> None:
    assert issubclass(NotEnoughFreeSpace, DiskFull)
    assert maintenance.NotEnoughSpace is NotEnoughFreeSpace  # its name before


def test_the_estimates_grow_with_what_the_step_writes() -> None:
    cache = space.DEFAULT_CACHE_BYTES
    assert space.in_place_conversion([0, 0], cache, 4096) == (0, 0)
    small = space.in_place_conversion([1 << 20, 1 << 20], cache, 4096)
    large = space.in_place_conversion([100 << 20, 100 << 20], cache, 4096)
    # The copies are set aside, not freed, in the conversion: schema pages whatever their size.
    assert small == large
    assert large[0] < 1 << 20
    assert large[1] <= large[0]
    assert space.rebuild_conversion(10 << 20, cache)[0] > 10 << 20
