"""What the demo generator draws from: its vocabulary file, and the standard library's text.

`vocabulary.json` (beside this module, shipped in the wheel) holds every phrase, name and
table; `load` reads it once per process into frozen, typed records and says which entry is
malformed when an edit broke it. `text_pool` reads a fixed set of standard-library modules
once, for the long "real" text that tool outputs quote.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any, Final, TypeAlias, TypeVar

from hermes_store.demo.sampling import Weighted

__all__ = [
    "SOURCES",
    "Distributions",
    "English",
    "Language",
    "Model",
    "Sources",
    "TextPool",
    "ToolOutputs",
    "Tools",
    "Vocabulary",
    "load",
    "parse",
    "text_pool",
]

SOURCES: Final[tuple[str, ...]] = ("cli", "telegram", "discord", "slack", "whatsapp")
"""Session sources, most frequent first (the generator's code builds each one's ids)."""

_FILE: Final = "vocabulary.json"
_NONE: Final[type] = type(None)
_NUMBER: Final[tuple[type, ...]] = (int, float)
_Shape: TypeAlias = dict[str, tuple[type, ...]]


@dataclass(frozen=True)
class Model:
    """One model the agent talks to, with its billing route and prices per 1M tokens."""

    name: str | None
    provider: str | None
    base_url: str | None
    price_in: float
    price_out: float
    reasons: bool
    call_prefix: str


@dataclass(frozen=True)
class Language:
    """One CJK language: how its phrases are joined and ended."""

    separator: str
    full_stop: str
    phrases: tuple[str, ...]


@dataclass(frozen=True)
class Distributions:
    """Quantile tables (33 evenly spaced quantiles each) and small weighted counts."""

    tool_output_chars: tuple[float, ...]
    session_messages: tuple[float, ...]
    session_gap_s: tuple[float, ...]
    user_think_s: tuple[float, ...]
    model_latency_s: tuple[float, ...]
    tool_latency_s: tuple[float, ...]
    tool_calls_per_round: Weighted[int]
    tool_rounds_per_turn: Weighted[int]


@dataclass(frozen=True)
class Sources:
    """How often each source starts a session, its chat kinds, and how sessions end."""

    weights: Weighted[str]
    chat_types: dict[str, tuple[str, ...]]
    end_reasons: dict[str, Weighted[str]]


@dataclass(frozen=True)
class Tools:
    """How often each tool is called, on the CLI and on a gateway, and each terminal kind."""

    cli: Weighted[str]
    gateway: Weighted[str]
    terminal: Weighted[str]


@dataclass(frozen=True)
class English:
    """The English names, phrases and templates."""

    idents: tuple[str, ...]
    paths: tuple[str, ...]
    branches: tuple[str, ...]
    versions: tuple[str, ...]
    cities: tuple[str, ...]
    urls: tuple[str, ...]
    commands: tuple[str, ...]
    errors: tuple[str, ...]
    words: tuple[str, ...]
    cli_prompts: tuple[str, ...]
    gateway_prompts: tuple[str, ...]
    observed_chatter: tuple[str, ...]
    assistant_sentences: tuple[str, ...]
    gateway_sentences: tuple[str, ...]
    bullets: tuple[str, ...]
    prefaces: tuple[str, ...]
    reasoning: tuple[str, ...]
    titles: tuple[str, ...]
    system_notes: tuple[str, ...]
    system_prompt: str
    memory_lines: tuple[str, ...]
    compaction_summary: str


@dataclass(frozen=True)
class ToolOutputs:
    """The small choices inside tool outputs."""

    web_search_suffixes: tuple[str, ...]
    page_roles: tuple[str, ...]
    todo_statuses: tuple[str, ...]
    cron_schedules: tuple[str, ...]
    skills: tuple[str, ...]
    test_commands: tuple[str, ...]
    commits: tuple[str, ...]
    authors: tuple[str, ...]
    ls_names: tuple[str, ...]
    record_statuses: tuple[str, ...]
    traceback_verbs: tuple[str, ...]
    python_modules: tuple[str, ...]
    packages: tuple[str, ...]
    images: tuple[str, ...]


@dataclass(frozen=True)
class Vocabulary:
    """Everything the generator draws from, one field per section of `vocabulary.json`."""

    stdlib_files: tuple[str, ...]
    distributions: Distributions
    sources: Sources
    models: Weighted[Model]
    tools: Tools
    projects: tuple[tuple[str, str | None], ...]
    english: English
    cjk: dict[str, Language]
    languages: Weighted[str]
    tool_outputs: ToolOutputs


# --------------------------------------------------------------------------------------
# Reading and checking the file.
# --------------------------------------------------------------------------------------

_T = TypeVar("_T")
_Section = TypeVar("_Section", English, ToolOutputs)


def _bad(path: str, wanted: str) -> ValueError:
    return ValueError(f"{_FILE}: {path} must be {wanted}; fix that entry (see the file's 'about')")


def _at(doc: object, path: str) -> object:
    """The value at a dotted path of the document."""
    value = doc
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise _bad(path, "present")
        value = value[key]
    return value


def _keys(value: object, path: str, keys: list[str]) -> dict[str, Any]:
    """The value as an object, which must hold exactly the given keys."""
    if not isinstance(value, dict) or sorted(value) != sorted(keys):
        raise _bad(path, f"an object with exactly the keys {', '.join(keys)}")
    return value


def _string(doc: object, path: str) -> str:
    value = _at(doc, path)
    if not isinstance(value, str):
        raise _bad(path, "a string")
    return value


def _strings(doc: object, path: str) -> tuple[str, ...]:
    value = _at(doc, path)
    if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
        raise _bad(path, "a non-empty list of strings")
    return tuple(value)


def _is_number(value: object) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


def _quantiles(doc: object, path: str) -> tuple[float, ...]:
    value = _at(doc, path)
    if not isinstance(value, list) or len(value) < 2 or not all(map(_is_number, value)):
        raise _bad(path, "a list of at least two numbers")
    return tuple(value)


def _weighted(doc: object, path: str, kind: type[_T]) -> Weighted[_T]:
    value = _at(doc, path)
    wanted = f"a non-empty list of [{kind.__name__}, positive weight] pairs"
    if not isinstance(value, list) or not value:
        raise _bad(path, wanted)
    pairs: list[tuple[_T, float]] = []
    for pair in value:
        if not isinstance(pair, list) or len(pair) != 2:
            raise _bad(path, wanted)
        item, weight = pair
        if not isinstance(item, kind) or not _is_number(weight) or weight <= 0:
            raise _bad(path, wanted)
        pairs.append((item, weight))
    return Weighted(pairs)


def _section(cls: type[_Section], doc: object, name: str) -> _Section:
    """A section whose fields are all strings or lists of strings."""
    names = [f.name for f in fields(cls)]
    _keys(_at(doc, name), name, names)
    values: dict[str, Any] = {
        f.name: (_string if f.type == "str" else _strings)(doc, f"{name}.{f.name}")
        for f in fields(cls)
    }
    return cls(**values)


def _checked(entry: object, path: str, shape: _Shape) -> dict[str, Any]:
    """An object with exactly the keys of `shape`, each of one of its types."""
    record = _keys(entry, path, list(shape))
    for key, types in shape.items():
        value = record[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise _bad(f"{path}.{key}", " or ".join(t.__name__ for t in types))
    return record


def _models(doc: object) -> Weighted[Model]:
    entries = _at(doc, "models")
    if not isinstance(entries, list) or not entries:
        raise _bad("models", "a non-empty list of objects")
    maybe: tuple[type, ...] = (str, _NONE)
    shape: _Shape = {
        "name": maybe,
        "provider": maybe,
        "base_url": maybe,
        "price_in": _NUMBER,
        "price_out": _NUMBER,
        "reasons": (bool,),
        "call_prefix": (str,),
        "weight": _NUMBER,
    }
    pairs: list[tuple[Model, float]] = []
    for i, entry in enumerate(entries):
        record = dict(_checked(entry, f"models[{i}]", shape))
        weight = record.pop("weight")
        pairs.append((Model(**record), weight))
    return Weighted(pairs)


def _sources(doc: object) -> Sources:
    weights = _weighted(doc, "sources.weights", str)
    if tuple(weights.items) != SOURCES:
        raise _bad("sources.weights", f"the sources {', '.join(SOURCES)}, in that order")
    gateways = list(SOURCES[1:])
    _keys(_at(doc, "sources.chat_types"), "sources.chat_types", gateways)
    _keys(_at(doc, "sources.end_reasons"), "sources.end_reasons", ["cli", "gateway"])
    return Sources(
        weights,
        {src: _strings(doc, f"sources.chat_types.{src}") for src in gateways},
        {kind: _weighted(doc, f"sources.end_reasons.{kind}", str) for kind in ("cli", "gateway")},
    )


def _cjk(doc: object) -> tuple[dict[str, Language], Weighted[str]]:
    section = _at(doc, "cjk")
    if not isinstance(section, dict) or not section:
        raise _bad("cjk", "an object with one entry per language")
    shape: _Shape = {
        "weight": _NUMBER,
        "separator": (str,),
        "full_stop": (str,),
        "phrases": (list,),
    }
    languages: dict[str, Language] = {}
    weights: list[tuple[str, float]] = []
    for lang, entry in section.items():
        record = _checked(entry, f"cjk.{lang}", shape)
        phrases = _strings(doc, f"cjk.{lang}.phrases")
        languages[lang] = Language(record["separator"], record["full_stop"], phrases)
        weights.append((lang, record["weight"]))
    return languages, Weighted(weights)


def parse(doc: object) -> Vocabulary:
    """Turn a JSON document shaped like `vocabulary.json` into a `Vocabulary`.

    Raises ValueError naming the first malformed entry.
    """
    sections = ["about", *(f.name for f in fields(Vocabulary) if f.name != "languages")]
    _keys(doc, "the document", sections)
    names = [f.name for f in fields(Distributions)]
    _keys(_at(doc, "distributions"), "distributions", names)
    tables: dict[str, Any] = {name: _quantiles(doc, f"distributions.{name}") for name in names[:-2]}
    distributions = Distributions(
        **tables,
        tool_calls_per_round=_weighted(doc, "distributions.tool_calls_per_round", int),
        tool_rounds_per_turn=_weighted(doc, "distributions.tool_rounds_per_turn", int),
    )
    _keys(_at(doc, "tools"), "tools", ["cli", "gateway", "terminal"])
    tools = Tools(
        *(_weighted(doc, f"tools.{kind}", str) for kind in ("cli", "gateway", "terminal"))
    )
    projects = _at(doc, "projects")
    if not isinstance(projects, list) or not projects:
        raise _bad("projects", "a non-empty list of objects")
    shape: _Shape = {"cwd": (str,), "repo_root": (str, _NONE)}
    checked = [_checked(p, f"projects[{i}]", shape) for i, p in enumerate(projects)]
    languages, language_weights = _cjk(doc)
    return Vocabulary(
        stdlib_files=tuple(sorted(_strings(doc, "stdlib_files"))),
        distributions=distributions,
        sources=_sources(doc),
        models=_models(doc),
        tools=tools,
        projects=tuple((p["cwd"], p["repo_root"]) for p in checked),
        english=_section(English, doc, "english"),
        cjk=languages,
        languages=language_weights,
        tool_outputs=_section(ToolOutputs, doc, "tool_outputs"),
    )


@functools.lru_cache(maxsize=1)
def load() -> Vocabulary:
    """The vocabulary shipped with the package, read once per process."""
    text = resources.files("hermes_store.demo").joinpath(_FILE).read_text(encoding="utf-8")
    return parse(json.loads(text))


# --------------------------------------------------------------------------------------
# Real text: a fixed set of standard-library modules that every CPython 3.11+ ships.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextPool:
    """The standard-library text, read once per process, with line and file offsets."""

    text: str
    lines: list[str]
    line_starts: list[int]
    file_starts: list[int]
    file_first_lines: list[int]
    names: tuple[str, ...]

    def slice(self, u: float, length: int) -> tuple[int, str]:
        """Return (offset, text) of `length` characters starting at a line near fraction u."""
        text = self.text
        start = int(u * len(text))
        newline = text.find("\n", start)
        start = newline + 1 if 0 <= newline < len(text) - 1 else 0
        chunk = text[start : start + length]
        while len(chunk) < length:
            chunk += "\n" + text[: length - len(chunk) - 1]
        return start, chunk

    def file_slice(self, u: float, length: int) -> tuple[int, str]:
        """Like `slice`, but within one file: up to `length` characters, never past its end."""
        text = self.text
        start, _ = self.slice(u, 0)
        f = bisect.bisect_right(self.file_starts, start) - 1
        begin = self.file_starts[f]
        end = self.file_starts[f + 1] - 1 if f + 1 < len(self.file_starts) else len(text)
        if start + length > end:  # move back so that the cut ends at the end of the file
            start = max(begin, end - length)
            if start > begin:
                start = text.find("\n", start - 1, end) + 1 or begin
        return start, text[start : min(start + length, end)]

    def where(self, offset: int) -> tuple[str, int]:
        """Return (module path, 1-based line number) of a text offset."""
        f = bisect.bisect_right(self.file_starts, offset) - 1
        line = bisect.bisect_right(self.line_starts, offset) - 1
        return self.names[f], line - self.file_first_lines[f] + 1

    def line_at(self, index: int) -> tuple[str, int, str]:
        """Return (module path, line number, text) of the line with a global index."""
        f = bisect.bisect_right(self.file_first_lines, index) - 1
        return self.names[f], index - self.file_first_lines[f] + 1, self.lines[index]


@functools.lru_cache(maxsize=2)
def text_pool(files: tuple[str, ...], fallback: tuple[str, ...]) -> TextPool:
    """Read the standard-library files once (missing ones are skipped).

    With none of them readable (a stdlib shipped as a zip, or stripped), the pool is the
    `fallback` sentences, repeated.
    """
    base = os.path.dirname(os.__file__)
    names: list[str] = []
    parts: list[str] = []
    for rel in files:
        try:
            with open(os.path.join(base, rel), encoding="utf-8", errors="replace") as fh:
                body = fh.read().replace("\x00", "")
        except OSError:
            continue
        if body.strip():
            names.append(rel)
            parts.append(body.rstrip("\n"))
    if not parts:
        names.append("fallback.txt")
        parts.append("\n".join(fallback * 200))
    file_starts: list[int] = []
    file_first_lines: list[int] = []
    lines: list[str] = []
    offset = 0
    for body in parts:
        file_starts.append(offset)
        file_first_lines.append(len(lines))
        lines.extend(body.split("\n"))
        offset += len(body) + 1
    text = "\n".join(parts)
    line_starts: list[int] = []
    pos = 0
    for line in lines:
        line_starts.append(pos)
        pos += len(line) + 1
    return TextPool(text, lines, line_starts, file_starts, file_first_lines, tuple(names))
