"""What the demo's messages say: user and assistant text, tool calls and their outputs.

`Writer` draws every phrase from the vocabulary (`vocabulary.json`) and quotes the
standard library's text; `hermes_store.demo.corpus` builds the sessions and rows around it.
"""

from __future__ import annotations

import base64
import bisect
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

from hermes_store.demo.sampling import Weighted, below, one, quantile, some
from hermes_store.demo.vocabulary import SOURCES, Model, Vocabulary, text_pool

__all__ = ["EPOCH", "MULTIMODAL_PREFIX", "Ctx", "Peer", "Writer", "dumps", "tokens"]

MULTIMODAL_PREFIX: Final = "\x00json:"
"""How the store marks content that is a JSON list of parts."""

EPOCH: Final = 1_745_000_000.0
"""2025-04-18 UTC: the first session starts shortly after."""

_P_CJK_USER_IN_EN: Final = 0.05  # tuned with the shares in `corpus`


def tokens(text: str) -> int:
    """Estimate tokens: about four bytes of ASCII or two CJK characters per token."""
    return max(1, (len(text) + len(text.encode("utf-8"))) // 8)


def dumps(value: object) -> str:
    """Serialise to JSON, keeping non-ASCII text as is."""
    return json.dumps(value, ensure_ascii=False)


@dataclass
class Peer:
    """A gateway conversation partner: who, and which chat."""

    user_id: str
    chat_id: str
    chat_type: str


@dataclass
class Ctx:
    """Everything that stays fixed within one session (and its compression children)."""

    source: str
    lang: str
    model: Model
    peer: Peer | None
    thread_id: str | None
    cwd: str | None
    repo_root: str | None
    branch: str | None
    tools: Weighted[str]
    tool_turn_p: float
    topic: tuple[str, str, str, str]


_TOPIC_KEYS: Final = ("path", "path2", "ident", "ident2")


class _Slots(dict[str, str]):
    """Template values drawn lazily, so that a template pays only for the slots it uses."""

    def __init__(self, writer: Writer, ctx: Ctx | None) -> None:
        super().__init__()
        self.writer = writer
        self.ctx = ctx

    def __missing__(self, key: str) -> str:
        writer = self.writer
        rng = writer.rng
        if key in _TOPIC_KEYS:  # the session's topic most of the time, else anything
            if self.ctx is not None and rng.random() < 0.6:
                values = self.ctx.topic
            else:
                en = writer.en
                values = (
                    one(rng, en.paths),
                    one(rng, en.paths),
                    one(rng, en.idents),
                    one(rng, en.idents),
                )
            self.update(zip(_TOPIC_KEYS, values, strict=True))
            return self[key]
        if key in writer.slot_vocab:
            value = one(rng, writer.slot_vocab[key])
        elif key == "num":
            value = str(3 + below(rng, 400))
        elif key == "hex":
            value = writer._hex(6)
        elif key == "model":
            value = (self.ctx.model.name if self.ctx else None) or "openai/gpt-4.1"
        else:
            raise KeyError(key)
        self[key] = value
        return value


class Writer:
    """Writes message texts and tool outputs from one seeded `random.Random`."""

    def __init__(self, seed: int, vocab: Vocabulary) -> None:
        tools = {*vocab.tools.cli.items, *vocab.tools.gateway.items}
        unknown = sorted(tools - _TOOL_BUILDERS.keys())
        unknown += sorted(set(vocab.tools.terminal.items) - _TERMINAL_BUILDERS.keys())
        if unknown:
            raise ValueError(
                f"vocabulary.json: tools name {', '.join(unknown)}, which the generator "
                "cannot write; use the names hermes_store/demo/content.py builds"
            )
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.en = vocab.english
        self.out = vocab.tool_outputs
        self.dist = vocab.distributions
        self.pool = text_pool(vocab.stdlib_files, vocab.english.assistant_sentences)
        self.chat_sentences = self.en.gateway_sentences + self.en.assistant_sentences
        en = self.en
        self.slot_vocab = {
            "cmd": en.commands,
            "err": en.errors,
            "branch": en.branches,
            "ver": en.versions,
            "city": en.cities,
            "city2": en.cities,
            "url": en.urls,
            "word": en.words,
        }

    # ---- small helpers --------------------------------------------------------------

    def _hex(self, digits: int) -> str:
        return f"{self.rng.getrandbits(4 * digits):0{digits}x}"

    def _bytes(self, n: int) -> bytes:
        return self.rng.getrandbits(8 * n).to_bytes(n, "little")

    def _digits(self, n: int) -> str:
        return str(10 ** (n - 1) + self.rng.getrandbits(48) % (9 * 10 ** (n - 1)))

    def _slots(self, ctx: Ctx | None = None) -> _Slots:
        return _Slots(self, ctx)

    def _fill(self, template: str, slots: dict[str, str]) -> str:
        return template.format_map(slots) if "{" in template else template

    def _cjk(self, lang: str, n: int, slots: dict[str, str]) -> str:
        language = self.vocab.cjk[lang]
        out = []
        for phrase in some(self.rng, language.phrases, n):
            p = self._fill(phrase, slots)
            out.append(p if p[-1] in "\u3002\uff1f\uff01.?!" else p + language.full_stop)
        return language.separator.join(out)

    def _code_block(self, lo: int, hi: int) -> str:
        _, code = self.pool.slice(self.rng.random(), lo + below(self.rng, hi - lo))
        return "```python\n" + code.rstrip() + "\n```"

    # ---- message texts --------------------------------------------------------------

    def _user_text(self, ctx: Ctx) -> str:
        rng = self.rng
        slots = self._slots(ctx)
        if ctx.lang != "en" and rng.random() < 0.85:
            text = self._cjk(ctx.lang, 1 + below(rng, 3), slots)
            if rng.random() < 0.3:  # mixed CJK / Latin
                text += " " + self._fill(one(rng, self.en.cli_prompts), slots)
            return text
        prompts = self.en.cli_prompts if ctx.source == "cli" else self.en.gateway_prompts
        text = self._fill(one(rng, prompts), slots)
        if rng.random() < _P_CJK_USER_IN_EN:
            lang = self.vocab.languages.pick(rng)
            text += " " + self._cjk(lang, 1, slots)
        elif ctx.source == "cli" and rng.random() < 0.06:
            text += "\n\n" + self._code_block(200, 1500)
        return text

    def _assistant_text(self, ctx: Ctx) -> str:
        rng = self.rng
        slots = self._slots(ctx)
        parts: list[str] = []
        if ctx.lang != "en" and rng.random() < 0.8:
            parts.append(self._cjk(ctx.lang, 2 + below(rng, 4), slots))
        else:
            pool = self.en.assistant_sentences if ctx.source == "cli" else self.chat_sentences
            sentences = some(rng, pool, 1 + below(rng, 10))
            while sentences:
                n = 1 + below(rng, 4)
                parts.append(" ".join(self._fill(x, slots) for x in sentences[:n]))
                del sentences[:n]
        if rng.random() < 0.3:
            parts.append(
                "\n".join(
                    self._fill(x, slots) for x in some(rng, self.en.bullets, 2 + below(rng, 4))
                )
            )
        if ctx.source == "cli" and rng.random() < 0.25:
            parts.append(self._code_block(150, 1800))
        return "\n\n".join(parts)

    def _multimodal(self, ctx: Ctx) -> str:
        rng = self.rng
        parts: list[dict[str, object]] = []
        if rng.random() < 0.8:
            parts.append({"type": "text", "text": self._user_text(ctx)})
        for _ in range(1 + (rng.random() < 0.2)):
            if rng.random() < 0.5:
                data = base64.b64encode(self._bytes(256 + below(rng, 1280))).decode("ascii")
                url = "data:image/png;base64," + data
            else:
                url = (
                    f"https://cdn.example.com/attachments/{self._digits(18)}/IMG_{self._hex(4)}.jpg"
                )
            parts.append({"type": "image_url", "image_url": {"url": url}})
        return MULTIMODAL_PREFIX + dumps(parts)

    def _reasoning(self, ctx: Ctx) -> str | None:
        rng = self.rng
        if not ctx.model.reasons or rng.random() < 0.6:
            return None
        slots = self._slots(ctx)
        return " ".join(
            self._fill(x, slots) for x in some(rng, self.en.reasoning, 1 + below(rng, 4))
        )

    def _summary(self, ctx: Ctx) -> str:
        slots = self._slots(ctx)
        text = self.en.compaction_summary.format_map(slots)
        if ctx.lang != "en":
            text += " " + self._cjk(ctx.lang, 2, slots)
        return text + "\n\n" + self._assistant_text(ctx)

    def _system_prompt(self, ctx: Ctx) -> str:
        rng = self.rng
        memory = "\n".join("- " + one(rng, self.en.memory_lines) for _ in range(2 + below(rng, 5)))
        where = (
            f"You are running in a terminal; cwd is {ctx.cwd}."
            if ctx.source == "cli"
            else f"You are talking to the user on {ctx.source}; keep replies short."
        )
        return f"{self.en.system_prompt}\n## Memory\n{memory}\n\n## Platform\n{where}\n"

    # ---- tool calls and outputs -----------------------------------------------------

    def _size(self) -> int:
        return int(quantile(self.rng, self.dist.tool_output_chars))

    def _tool(self, name: str, ctx: Ctx) -> tuple[dict[str, object], str]:
        """Return (arguments, output) of one call of the named tool."""
        return _TOOL_BUILDERS[name](self, ctx)

    def _terminal(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        kind = self.vocab.tools.terminal.pick(rng)
        size = self._size()
        command, output, code = _TERMINAL_BUILDERS[kind](self, size, ctx)
        args: dict[str, object] = {"command": command}
        if rng.random() < 0.2:
            args["timeout"] = 300
        return args, dumps({"output": output, "exit_code": code, "error": None})

    def _read_file(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        size = self._size()
        start, chunk = self.pool.file_slice(self.rng.random(), size * 7 // 8)
        name, lineno = self.pool.where(start)
        lines = chunk.split("\n")
        numbered = "\n".join(f"{n:>6}|{line}" for n, line in enumerate(lines, lineno))
        path = f"/usr/lib/python3.11/{name}"
        args: dict[str, object] = {"path": path, "offset": lineno, "limit": len(lines)}
        body = {
            "content": numbered,
            "total_lines": lineno + len(lines) + below(self.rng, 900),
            "truncated": self.rng.random() < 0.3,
        }
        return args, dumps(body)

    def _grep(self, size: int) -> list[str]:
        """Return grep-style `path:line:text` matches of about `size` characters."""
        rng = self.rng
        pool = self.pool
        matches: list[str] = []
        drawn = 0
        wanted = 1 + size // 55  # ~55 characters a match; the draws never depend on the text
        while drawn < wanted:  # a few files, a run of scattered lines in each
            index = below(rng, len(pool.lines))
            name, lineno, _ = pool.line_at(index)
            f = bisect.bisect_right(pool.file_first_lines, index)
            stop = pool.file_first_lines[f] if f < len(pool.file_first_lines) else len(pool.lines)
            for _ in range(min(3 + below(rng, 30), wanted - drawn)):
                line = pool.lines[index].strip() if index < stop else ""
                if line:  # past the end of the file or blank: keep drawing, write nothing
                    matches.append(f"{name}:{lineno}:{line}")
                drawn += 1
                step = 1 + below(rng, 40)
                index += step
                lineno += step
        return matches

    def _search_files(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        pattern = one(rng, self.en.idents) if rng.random() < 0.5 else ctx.topic[2]
        matches = self._grep(min(self._size(), 12000))
        args: dict[str, object] = {"pattern": pattern, "path": ".", "target": "content"}
        return args, dumps({"total_count": len(matches), "matches": "\n".join(matches)})

    def _write_file(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        _, content = self.pool.slice(self.rng.random(), 300 + below(self.rng, 3500))
        path = ctx.topic[0]
        args: dict[str, object] = {"path": path, "content": content}
        lines = content.count("\n") + 1
        return args, dumps(
            {
                "success": True,
                "path": path,
                "lines_written": lines,
                "bytes_written": len(content.encode("utf-8")),
                "lint": {"status": "ok", "checker": "ruff", "issues": []},
            }
        )

    def _patch(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        _, old = self.pool.slice(rng.random(), 80 + below(rng, 500))
        new = (
            old.replace("    ", "    # TODO: fix\n    ", 1)
            if rng.random() < 0.5
            else (old + "\n" + self._fill(one(rng, self.en.bullets), self._slots(ctx)).lstrip("- "))
        )
        path = ctx.topic[0]
        old_lines, new_lines = old.split("\n"), new.split("\n")
        at = 1 + below(rng, 400)
        diff = (
            f"--- a/{path}\n+++ b/{path}\n@@ -{at},{len(old_lines)} +{at},{len(new_lines)} @@\n"
            + "\n".join("-" + x for x in old_lines)
            + "\n"
            + "\n".join("+" + x for x in new_lines)
        )
        args: dict[str, object] = {"path": path, "old_string": old, "new_string": new}
        return args, dumps({"success": True, "diff": diff, "files_modified": [path]})

    def _web_results(self, n: int, ctx: Ctx) -> list[dict[str, str]]:
        rng = self.rng
        out = []
        for _ in range(n):
            start, text = self.pool.slice(rng.random(), 120 + below(rng, 260))
            name, _ = self.pool.where(start)
            title = f"{name} - {one(rng, self.en.idents)} documentation"
            description = " ".join(text.split())
            if ctx.lang != "en" and rng.random() < 0.5:  # a page in the user's language
                slots = self._slots(ctx)
                title = self._cjk(ctx.lang, 1, slots)
                description = self._cjk(ctx.lang, 2 + below(rng, 3), slots)
            out.append({"title": title, "url": one(rng, self.en.urls), "description": description})
        return out

    def _web_search(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        slots = self._slots(ctx)
        if ctx.lang != "en" and rng.random() < 0.5:
            query = self._cjk(ctx.lang, 1, slots)
        else:
            query = f"{slots['ident']} {one(rng, self.out.web_search_suffixes)}"
        return {"query": query}, dumps(
            {"success": True, "data": {"web": self._web_results(3 + below(rng, 8), ctx)}}
        )

    def _web_extract(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        url = one(rng, self.en.urls)
        start, text = self.pool.slice(rng.random(), self._size())
        name, _ = self.pool.where(start)
        page = {"url": url, "title": f"{name} | reference", "content": f"# {name}\n\n{text}"}
        return {"urls": [url]}, dumps({"results": [page]})

    def _execute_code(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        _, code = self.pool.slice(rng.random(), 200 + below(rng, 1400))
        _, out = self.pool.slice(rng.random(), self._size() // 2)
        body = {
            "status": "success",
            "output": out,
            "tool_calls_made": below(rng, 4),
            "duration_seconds": round(0.05 + rng.random() * 9, 2),
        }
        return {"code": code}, dumps(body)

    def _browser(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        url = one(rng, self.en.urls)
        size = self._size()
        lines = [f'- document "{self._fill(one(rng, self.en.titles), self._slots(ctx))}"']
        for ref in range(1, 2 + size // 85):  # ~85 characters a line
            _, text = self.pool.slice(rng.random(), 30 + below(rng, 90))
            kind = one(rng, self.out.page_roles)
            lines.append(f'  - {kind} "{" ".join(text.split())}" [ref=e{ref}]')
        return {"url": url}, dumps({"success": True, "url": url, "snapshot": "\n".join(lines)})

    def _todo(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        slots = self._slots(ctx)
        todos = [
            {
                "id": str(i + 1),
                "content": self._fill(one(rng, self.en.bullets), slots)[2:],
                "status": one(rng, self.out.todo_statuses),
            }
            for i in range(1 + below(rng, 5))
        ]
        return {"todos": todos}, dumps({"todos": todos, "summary": {"total": len(todos)}})

    def _memory(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        entry = one(rng, self.en.memory_lines)
        args: dict[str, object] = {"action": "add", "target": "memory", "content": entry}
        entries = [x for x in some(rng, self.en.memory_lines, 1 + below(rng, 6)) if x != entry]
        entries.append(entry)
        return args, dumps(
            {
                "success": True,
                "message": "Entry added.",
                "entries": entries,
                "usage": f"{len(entries) * 7}% of 2,200 chars",
            }
        )

    def _session_search(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        slots = self._slots(ctx)
        query = slots["ident"] if ctx.lang == "en" else self._cjk(ctx.lang, 1, slots)
        results = []
        for _ in range(1 + below(rng, 3)):
            when = time.gmtime(int(EPOCH - 86_400 * (1 + rng.random() * 90)))
            results.append(
                {
                    "session_id": time.strftime("%Y%m%d_%H%M%S_", when) + self._hex(6),
                    "when": time.strftime("%Y-%m-%d", when),
                    "summary": self._assistant_text(ctx),
                }
            )
        return {"query": query}, dumps({"success": True, "results": results})

    def _delegate(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        slots = self._slots(ctx)
        goal = self._fill(one(self.rng, self.en.cli_prompts), slots)
        result = {
            "status": "completed",
            "summary": self._assistant_text(ctx),
            "duration_seconds": round(20 + self.rng.random() * 400, 1),
        }
        return {"goal": goal}, dumps({"results": [result]})

    def _send_message(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        target = f"{one(self.rng, SOURCES[1:])}:{self._digits(10)}"
        text = self._assistant_text(ctx)[:400]
        result = {
            "success": True,
            "target": target,
            "message_id": self._digits(12),
            "delivered_chars": len(text),
            "note": "Message delivered to the home channel.",
        }
        return {"target": target, "message": text}, dumps(result)

    def _cronjob(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        schedule = one(self.rng, self.out.cron_schedules)
        args: dict[str, object] = {
            "action": "create",
            "schedule": schedule,
            "prompt": self._user_text(ctx),
        }
        job = {
            "job_id": self._hex(8),
            "schedule": schedule,
            "prompt": args["prompt"],
            "deliver": "origin",
            "next_run_at": "2025-06-13T09:00:00+00:00",
            "enabled": True,
        }
        return args, dumps({"success": True, "job": job, "jobs_total": 1 + below(self.rng, 9)})

    def _vision(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        args: dict[str, object] = {
            "image_url": f"~/.hermes/cache/img_{self._hex(8)}.png",
            "question": "What does this screenshot show?",
        }
        return args, dumps({"success": True, "analysis": self._assistant_text(ctx)})

    def _skill_view(self, ctx: Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        name = one(rng, self.out.skills)
        _, body = self.pool.slice(rng.random(), self._size())
        return {"name": name}, dumps(
            {"success": True, "name": name, "content": f"---\nname: {name}\n---\n\n{body}"}
        )

    # ---- terminal outputs: (command, output, exit code) ------------------------------

    def _t_cat(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        start, text = self.pool.file_slice(self.rng.random(), size)
        name, _ = self.pool.where(start)
        return f"cat /usr/lib/python3.11/{name}", text, 0

    def _t_rg(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        pattern = one(self.rng, self.en.idents)
        return f"rg -n '{pattern}' .", "\n".join(self._grep(min(size, 12000))), 0

    def _t_pytest(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        rng = self.rng
        passed = 20 + below(rng, 600)
        failed = below(rng, 4) if rng.random() < 0.5 else 0
        lines = [
            "============================= test session starts =============================",
            "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0",
            f"rootdir: {ctx.cwd or '/home/alex/code/hermes-agent'}",
            "plugins: xdist-3.6.1, benchmark-4.0.0, alembic-0.11.1",
            f"collected {passed + failed} items",
            "",
        ]
        pct = 0
        while pct < 100:
            pct = min(100, pct + 3 + below(rng, 20))
            dots = "." * (5 + below(rng, 40))
            lines.append(f"tests/test_{one(rng, self.en.words)}.py {dots:<50} [{pct:>3}%]")
        out = "\n".join(lines)
        rule = "=" * 30
        if failed:
            test = f"test_{one(rng, self.en.words)}_{one(rng, self.en.idents)}"
            _, src = self.pool.slice(rng.random(), max(200, size - len(out)))
            error = one(rng, self.en.errors)
            out += (
                f"\n\n{rule} FAILURES {rule}\n____ {test} ____\n\n{src}\n"
                f"E       {error}\n{rule} short test summary info {rule}\n"
                f"FAILED tests/test_{one(rng, self.en.words)}.py::{test} - {error}"
            )
        summary = f"{failed} failed, {passed} passed" if failed else f"{passed} passed"
        out += f"\n{rule} {summary} in {rng.random() * 90 + 1:.2f}s {rule}"
        command = one(rng, self.out.test_commands)
        return command, out, 1 if failed else 0

    def _t_git_diff(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        rng = self.rng
        start, text = self.pool.file_slice(rng.random(), size)
        name, lineno = self.pool.where(start)
        lines = text.split("\n")
        k = below(rng, len(lines))
        body = "".join(" " + line + "\n" for line in lines[:k])
        body += f"-{lines[k]}\n+{lines[k]}  # TODO: fix\n"
        body += "".join(" " + line + "\n" for line in lines[k + 1 :])
        head = (
            f"diff --git a/{name} b/{name}\nindex {self._hex(7)}..{self._hex(7)} 100644\n"
            f"--- a/{name}\n+++ b/{name}\n@@ -{lineno},{len(lines)} +{lineno},"
            f"{len(lines) + 1} @@\n"
        )
        return "git diff", head + body, 0

    def _t_git_log(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        rng = self.rng
        entries: list[str] = []
        total = 0
        day = 1 + below(rng, 28)
        while total < min(size, 8000):
            entry = (
                f"commit {self._hex(40)}\nAuthor: {one(rng, self.out.authors)}\n"
                f"Date:   Thu Jun {day:>2} {below(rng, 24):02d}:{below(rng, 60):02d}:"
                f"{below(rng, 60):02d} 2025 +0200\n\n    {one(rng, self.out.commits)}\n"
            )
            entries.append(entry)
            total += len(entry)
        return "git log -n 20", "\n".join(entries), 0

    def _t_ls(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        rng = self.rng
        lines = [
            f"total {8 + below(rng, 400)}",
            "drwxr-xr-x  12 alex staff     384 Jun 12 09:14 .",
            "drwxr-xr-x  40 alex staff    1280 Jun  3 18:40 ..",
        ]
        names = self.pool.names
        for _ in range(1 + min(size, 2500) // 60):  # ~60 characters a line
            is_dir = rng.random() < 0.3
            name = one(rng, self.out.ls_names) if rng.random() < 0.5 else one(rng, names)
            lines.append(
                f"{'drwxr-xr-x' if is_dir else '-rw-r--r--'} {1 + below(rng, 12):>3} alex "
                f"staff {below(rng, 90000):>7} Jun {1 + below(rng, 28):>2} "
                f"{below(rng, 24):02d}:{below(rng, 60):02d} {name}"
            )
        return f"ls -la {ctx.cwd or '~'}", "\n".join(lines), 0

    def _t_git_status(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        rng = self.rng
        changed = "\n".join(
            f"\tmodified:   {one(rng, self.en.paths)}" for _ in range(1 + below(rng, 8))
        )
        out = (
            f"On branch {ctx.branch or 'main'}\nYour branch is ahead of 'origin/main' by "
            f"{1 + below(rng, 5)} commits.\n\nChanges not staged for commit:\n{changed}\n\n"
            "Untracked files:\n\tmy-app.config.ts.bak\n\tnotes/P2.2-plan.md\n"
        )
        return "git status", out, 0

    def _t_json(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        rng = self.rng
        records = []
        for i in range(max(1, min(size, 12000) // 230)):
            records.append(
                {
                    "id": 1000 + i,
                    "name": one(rng, self.en.idents),
                    "status": one(rng, self.out.record_statuses),
                    "updated_at": f"2025-06-{1 + below(rng, 28):02d}T{below(rng, 24):02d}:"
                    f"{below(rng, 60):02d}:00Z",
                    "tags": [one(rng, self.en.words), one(rng, self.en.words)],
                    "path": one(rng, self.en.paths),
                }
            )
        url = "https://api.example.com/v2/users.list?limit=100"
        return f"curl -s '{url}' | jq .", json.dumps({"items": records}, indent=2), 0

    def _t_traceback(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        rng = self.rng
        frames = ["Traceback (most recent call last):"]
        for _ in range(2 + below(rng, 8)):
            name, lineno, line = self.pool.line_at(below(rng, len(self.pool.lines)))
            frames.append(
                f'  File "/usr/lib/python3.11/{name}", line {lineno}, in '
                f"{one(rng, self.en.words)}_{one(rng, self.out.traceback_verbs)}"
            )
            frames.append(f"    {line.strip()}")
        frames.append(one(rng, self.en.errors))
        return (
            f"python -m {one(rng, self.out.python_modules)}",
            "\n".join(frames),
            1,
        )

    def _t_pip(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        rng = self.rng
        pkgs = self.out.packages
        lines = ["Obtaining file:///home/alex/code/hermes-agent"]
        chosen = [pkgs[below(rng, len(pkgs))] for _ in range(2 + below(rng, 6))]
        for p in chosen:
            lines.append(f"Collecting {p}>=1.0")
            lines.append(
                f"  Downloading {p}-{1 + below(rng, 3)}.{below(rng, 20)}.{below(rng, 9)}"
                f"-py3-none-any.whl ({10 + below(rng, 900)} kB)"
            )
        lines.append("Successfully installed " + " ".join(chosen))
        return "pip install -e '.[dev]'", "\n".join(lines), 0

    def _t_build(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        rng = self.rng
        lines = [
            "> my-app@0.4.1 build",
            "> next build",
            "",
            "   Creating an optimized build",
            " \u2713 Compiled successfully",
            "Route (app)   Size   First Load JS",
        ]
        for _ in range(3 + below(rng, 25)):
            lines.append(
                f"\u251c \u25cb /{one(rng, self.en.words)}/{one(rng, self.en.idents)}   "
                f"{below(rng, 900)} B   {80 + below(rng, 60)} kB"
            )
        return "npm run build", "\n".join(lines), 0

    def _t_docker(self, size: int, ctx: Ctx) -> tuple[str, str, int]:
        rng = self.rng
        lines = ["CONTAINER ID   IMAGE                 STATUS          NAMES"]
        for _ in range(1 + below(rng, 8)):
            lines.append(
                f"{self._hex(12)}   {one(rng, self.out.images)}"
                f"   Up {1 + below(rng, 40)} hours   {one(rng, self.en.idents)}"
            )
        return "docker ps", "\n".join(lines), 0

    # ---- sessions -------------------------------------------------------------------


_Builder: TypeAlias = Callable[[Writer, Ctx], tuple[dict[str, object], str]]
_TermBuilder: TypeAlias = Callable[[Writer, int, Ctx], tuple[str, str, int]]

_TOOL_BUILDERS: Final[dict[str, _Builder]] = {
    "terminal": Writer._terminal,
    "read_file": Writer._read_file,
    "search_files": Writer._search_files,
    "write_file": Writer._write_file,
    "patch": Writer._patch,
    "web_search": Writer._web_search,
    "web_extract": Writer._web_extract,
    "execute_code": Writer._execute_code,
    "browser_navigate": Writer._browser,
    "todo": Writer._todo,
    "memory": Writer._memory,
    "session_search": Writer._session_search,
    "delegate_task": Writer._delegate,
    "send_message": Writer._send_message,
    "cronjob": Writer._cronjob,
    "vision_analyze": Writer._vision,
    "skill_view": Writer._skill_view,
}
_TERMINAL_BUILDERS: Final[dict[str, _TermBuilder]] = {
    "cat": Writer._t_cat,
    "rg": Writer._t_rg,
    "pytest": Writer._t_pytest,
    "git_diff": Writer._t_git_diff,
    "git_log": Writer._t_git_log,
    "ls": Writer._t_ls,
    "git_status": Writer._t_git_status,
    "json": Writer._t_json,
    "traceback": Writer._t_traceback,
    "pip": Writer._t_pip,
    "build": Writer._t_build,
    "docker": Writer._t_docker,
}
