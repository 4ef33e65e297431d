"""Sanitising and CJK detection of the search contract (docs/search.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_store.search import MAX_QUERY_CHARS, contains_cjk, count_cjk, sanitize_query

SANITIZE_CASES = [
    # step 6: runs of word characters joined by ".", "_" or "-" are quoted, in one pass
    ("chat-send", '"chat-send"'),
    ("P2.2", '"P2.2"'),
    ("my-app.config.ts", '"my-app.config.ts"'),
    ("foo_bar", '"foo_bar"'),
    ("deploy chat-send now", 'deploy "chat-send" now'),
    ("plain words only", "plain words only"),
    ("_private trailing_", "_private trailing_"),
    ("a--b", "a--b"),  # a doubled joiner is not a join
    ("中文-测试", '"中文-测试"'),
    ("chat-send*", '"chat-send"*'),
    # step 3: + { } ( ) : ^ become spaces outside phrases (column-filter lookalikes included)
    ("TODO: fix", "TODO  fix"),
    ("content: foo", "content  foo"),
    ("foo+bar", "foo bar"),
    ("{a}(b)^c", "a  b  c"),
    ("f(x)", "f x"),
    # step 2: unmatched quotes become spaces, balanced phrases are kept verbatim
    ('say "hello', "say  hello"),
    ('"unterminated phrase', "unterminated phrase"),
    ('"a b" "c', '"a b"  c'),
    ('"foo: (bar)^ +baz*"', '"foo: (bar)^ +baz*"'),
    ('"chat-send"', '"chat-send"'),
    ('"AND"', '"AND"'),
    ('x "a.b" y.z', 'x "a.b" "y.z"'),
    ('"one" two "three four"', '"one" two "three four"'),
    ('""', '""'),
    ('"a".b', '"a".b'),
    # step 4: runs of * collapse; a * at the start or after whitespace is dropped
    ("***foo", "foo"),
    (" *bar", "bar"),
    ("foo *bar", "foo bar"),
    ("foo***", "foo*"),
    ("py**th", "py*th"),
    ("pyth*", "pyth*"),
    ("*", ""),
    # step 5: a leading and a trailing AND / OR / NOT, any case, whole words only
    ("AND foo OR", "foo"),
    ("NOT", ""),
    ("and foo", "foo"),
    ("foo not", "foo"),
    ("Or foo", "foo"),
    ("OR AND foo", "AND foo"),
    ("ANDROID", "ANDROID"),
    ("foo ORACLE", "foo ORACLE"),
    ("foo AND bar", "foo AND bar"),
    ("NOT foo AND bar NOT", "foo AND bar"),
    ("AND", ""),
    # step 7 and the whole pipeline
    ("   spaced   out   ", "spaced   out"),
    ("", ""),
    ("   ", ""),
    ("+(){}", ""),
    # placeholders never collide with user text
    ('\ue000 "foo"', '\ue000 "foo"'),
    ('\x00Q0\x00 "foo"', '\x00Q0\x00 "foo"'),
]


@pytest.mark.parametrize(("query", "expected"), SANITIZE_CASES)
def test_sanitize_query(query: str, expected: str) -> None:
    assert sanitize_query(query) == expected


def test_sanitize_keeps_only_the_first_2048_characters() -> None:
    assert MAX_QUERY_CHARS == 2048
    assert sanitize_query("a" * 3000) == "a" * 2048
    assert sanitize_query("ab " * 1000) == ("ab " * 1000)[:2048].strip()


def test_sanitize_cuts_before_pairing_quotes() -> None:
    # the closing quote lies beyond the cut, so the opening one is unmatched
    assert sanitize_query('"' + "x" * 2050 + '"') == "x" * 2047


def test_sanitize_keeps_phrases_even_with_private_use_characters_around() -> None:
    used = "".join(chr(code) for code in range(0xE000, 0xE010))
    query = f'{used} "kept: (as) is" tail-word'
    assert sanitize_query(query) == f'{used} "kept: (as) is" "tail-word"'


CJK_RANGES = [
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x3000, 0x303F),
    (0x3040, 0x309F),
    (0x30A0, 0x30FF),
    (0xAC00, 0xD7AF),
]


@pytest.mark.parametrize(("low", "high"), CJK_RANGES)
def test_contains_cjk_range_ends(low: int, high: int) -> None:
    assert contains_cjk(chr(low))
    assert contains_cjk(chr(high))
    assert contains_cjk(f"abc {chr((low + high) // 2)} def")


@pytest.mark.parametrize(
    "code",
    [
        *(0x2FFF, 0x3100, 0x33FF, 0x4DC0, 0x4DFF, 0xA000, 0xABFF, 0xD7B0, 0x1FFFF, 0x2A6E0),
        *(0x1100, 0xF900, 0xFF21, 0xFF66, 0x2E80),  # Jamo, compatibility, fullwidth, radicals
    ],
)
def test_contains_cjk_outside_the_ranges(code: int) -> None:
    assert not contains_cjk(chr(code))


def test_contains_and_count_cjk_on_mixed_text() -> None:
    assert not contains_cjk("")
    assert not contains_cjk("plain ascii, café, Ελληνικά")
    assert contains_cjk("deploy 数据库")
    assert count_cjk("数据库 です 합니다 abc") == 3 + 2 + 3
    assert count_cjk("。「」") == 3  # CJK symbols and punctuation count too


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=3000))
def test_sanitize_never_raises(query: str) -> None:
    result = sanitize_query(query)
    assert isinstance(result, str)
    assert result == result.strip()


QUERY_PIECES = st.sampled_from(
    [
        *("foo", "bar", "AND", "or", "NOT", '"', "*", "-", ".", "_", ":", "(", ")", "+", "^"),
        *(" ", "{", "}", "中文", "です", "P2", "\t", "\x00", "\ud800"),
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(QUERY_PIECES, max_size=20).map("".join))
def test_sanitize_leaves_no_special_character_outside_phrases(query: str) -> None:
    result = sanitize_query(query)
    outside = result.split('"')[::2]  # text between phrases (quotes are balanced)
    assert result.count('"') % 2 == 0
    assert not any(char in part for part in outside for char in "+{}():^")
    assert not any("**" in part for part in outside)
