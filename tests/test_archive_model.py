"""Archive and restore, cut short at random steps, interleaved with an agent's writes: what
the two stores hold between them is always what a naive model of the agent's writes holds,
and, once no batch is in flight, each session is in exactly one store."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from archive_support import message_ids, rows_of, session_ids
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hermes_store import migrate
from hermes_store.archive import archive_sessions, criterion, move, restore_session
from hermes_store.errors import SessionNotFound
from hermes_store.store import NewMessage, Store

pytestmark = pytest.mark.slow

OLD = 1_000_000.0
STEPS = ("marked", "copying", "copied", "verified", "deleting", "deleted", "done")


class Cut(BaseException):
    """The run stopped at a step (as a kill would: nothing after it runs)."""


def _cut_at(step: str | None) -> None:
    def hook(name: str) -> None:
        if name == step:
            raise Cut(name)

    move.STEP_HOOK = hook if step is not None else None


class ArchiveModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.TemporaryDirectory(prefix="hermes-archive-model-")
        self.hot = Path(self.folder.name) / "hot.db"
        self.archive = Path(self.folder.name) / "archive.db"
        migrate.upgrade(str(self.hot))
        #: session -> message id -> text: everything the agent was told was stored.
        self.model: dict[str, dict[int, str]] = {}
        self.parents: dict[str, str | None] = {}
        self.counter = 0

    def teardown(self) -> None:
        move.STEP_HOOK = None
        self.folder.cleanup()

    def _new_id(self) -> str:
        self.counter += 1
        return f"s{self.counter:03d}"

    @rule(old=st.booleans(), ended=st.booleans(), child=st.booleans(), data=st.data())
    def create(self, old: bool, ended: bool, child: bool, data: Any) -> None:
        sid = self._new_id()
        here = sorted(session_ids(self.hot))
        parent = data.draw(st.sampled_from(here)) if child and here else None
        start = OLD + self.counter if old else None
        with Store.open(str(self.hot)) as store:
            store.create_session(sid, "cli", started_at=start, parent_session_id=parent)
            ids = store.append_messages(
                sid,
                [
                    NewMessage(role="user", content=f"{sid} {i}", timestamp=start and start + i)
                    for i in range(2)
                ],
            )
            if ended:
                store.end_session(sid, "done", ended_at=start and start + 10)
        self.model[sid] = {mid: f"{sid} {i}" for i, mid in enumerate(ids)}
        self.parents[sid] = parent

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def append(self, data: Any) -> None:
        sid = data.draw(st.sampled_from(sorted(self.model)))
        text = f"late {self.counter}"
        self.counter += 1
        try:
            with Store.open(str(self.hot)) as store:
                (mid,) = store.append_messages(sid, [NewMessage(role="user", content=text)])
        except SessionNotFound:
            return  # archived: the agent no longer sees it
        self.model[sid][mid] = text

    @rule(cut=st.sampled_from((None, *STEPS)))
    def archive_old(self, cut: str | None) -> None:
        _cut_at(cut)
        try:
            archive_sessions(str(self.hot), str(self.archive), criterion(older_than="90d"))
        except Cut:
            pass
        finally:
            _cut_at(None)

    @precondition(lambda self: self.archive.exists())
    @rule(cut=st.sampled_from((None, *STEPS)), data=st.data())
    def restore_one(self, cut: str | None, data: Any) -> None:
        there = sorted(session_ids(self.archive))
        if not there:
            return
        sid = data.draw(st.sampled_from(there))
        _cut_at(cut)
        try:
            restore_session(sid, str(self.hot), str(self.archive))
        except Cut:
            pass
        finally:
            _cut_at(None)

    @invariant()
    def union_is_the_model(self) -> None:
        texts = dict(rows_of(self.hot, "SELECT id, content FROM messages"))
        if self.archive.exists():
            texts.update(rows_of(self.archive, "SELECT id, content FROM messages"))
        wanted = {mid: text for messages in self.model.values() for mid, text in messages.items()}
        assert texts == wanted

    @invariant()
    def one_store_each_when_nothing_in_flight(self) -> None:
        if not self.archive.exists():
            return
        marked = "SELECT 1 FROM state_meta WHERE key = 'hermes_store.archive.batch'"
        if rows_of(self.hot, marked) or rows_of(self.archive, marked):
            return
        assert not session_ids(self.hot) & session_ids(self.archive)
        assert not message_ids(self.hot) & message_ids(self.archive)
        hot = session_ids(self.hot)
        for sid, parent in self.parents.items():  # no tree split between the stores
            if parent is not None:
                assert (sid in hot) == (parent in hot)


ArchiveModel.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_archive_model = ArchiveModel.TestCase
