"""SQLite FTS5's ``snippet()`` reproduced in pure Python, for databases without FTS5, and
snippets of bounded cost for texts too large or too dense for it.

The search contract (docs/search.md) returns, for each hit,
``snippet(messages_fts, 0, '>>>', '<<<', '...', 40)`` on the word path and
``snippet(messages_fts_trigram, 0, '>>>', '<<<', '...', 40)`` on the trigram path. A
database without FTS5 (PostgreSQL) fetches the indexed text of each hit on the page and
builds the same string here: byte for byte what SQLite 3.40's FTS5 returns for the same
text and query, standard library only, no database access.

API
---
``Term = tuple[str, bool]``
    One query token as written in the query (not folded: this module folds it the way the
    tokenizer folds the document), and whether it is a prefix (``tok*``). A term whose text
    the tokenizer splits (``foo_bar``, ``don't``) stands for its tokens in a row. As in
    FTS5, a term's prefix flag is set on the last token of the phrase so far, even when
    the term itself brings no token (``"e"* + "-"`` is the exact token ``e``).
``Phrase = Sequence[Term]``
    A bare word is a one-term phrase; ``"a b c"`` is a three-term phrase; ``"a b"*`` makes
    the last term a prefix.
``word_snippet(text, phrases, *, near=(), groups=None, tokens=40, start=">>>",
end="<<<", ellipsis="...") -> str``
    The ``unicode61`` tokenizer with its default options. ``phrases`` are the query's
    phrases in the order they appear in it (FTS5 numbers them so, and the number breaks ties
    between instances at one position). ``near`` lists the NEAR groups as ``(indexes into
    phrases, distance)``: their phrases keep only the instances that take part in a match of
    the group (FTS5's own trimming), none at all when the group does not match; except
    that, as in FTS5, when every token of a failed group occurs in the row, the phrases
    tested before the first one that does not occur as a phrase keep all their instances
    and show when the group is an OR branch of its own.
    ``groups``, when given, tells which phrases count on this row: FTS5 highlights a phrase
    only where the part of the query that holds it matched the row. The contract's
    sanitised queries have no parentheses, and FTS5 binds juxtaposition tightest, then
    ``NOT``, then ``AND``, then ``OR``: a query is an OR of groups, and each group is
    ``(operands, negated)``, both lists of operands, an operand being the indexes of the
    phrases written side by side (a NEAR group's phrases included). ``operands`` are the
    group's operands joined by ``AND`` (each the left side of its ``NOT`` chain),
    ``negated`` the right sides of its ``NOT`` operators. A group matches when every phrase
    of its operands occurs (after NEAR trimming) and no negated operand has all of its
    phrases occurring; only the phrases of ``operands`` of matching groups count. A phrase
    that folds to no token at all (``"..."``) is dropped from its operand, and an operand
    left empty matches nothing, as in FTS5. ``None`` counts every phrase that occurs, which
    is exact for queries without ``NOT`` whose groups all matched (a plain AND query, or
    an OR of single phrases).

    The one case this cannot follow: FTS5 moves the phrases after a ``NOT`` only while the
    NOT's left side has rows left in the table; once it has none, those phrases stay on
    the row where they were and are highlighted there if that row comes back through
    another OR branch. Likewise, when a NEAR group fails on a row holding all of its
    tokens, the phrases after the first one that does not occur as a phrase are not
    tested on that row, and FTS5 may report the positions they had on the last row where
    they were. Both depend on the table's other rows; this module never highlights phrases
    after ``NOT``, nor the untested phrases of a NEAR group. And where SQLite 3.40 itself
    is not stable (its NEAR trimming can read a buffer it has just grown, losing the last
    instances of a NEAR group on long texts from one run to the next), this module gives
    every instance that takes part in a match.
``trigram_snippet(text, substrings, *, groups=None, tokens=40, start=">>>", end="<<<",
ellipsis="...") -> str``
    The ``trigram`` tokenizer (``case_sensitive=0``); each substring is one quoted token of
    the trigram MATCH, 3 characters or more (shorter ones match nothing); ``groups`` as
    above, over the substrings.
``exact_is_bounded(text, phrases, *, trigram=False) -> bool``
    Whether FTS5's snippet of ``text`` stays cheap: its time grows with the square of the
    phrases' instances in the row, and this says whether there are at most
    ``EXACT_INSTANCES`` (found by regular expressions, not by the tokenizer, which in
    Python takes about a second a megabyte).
``bounded_word_snippet(...)``, ``bounded_trigram_snippet(...)``
    The same arguments as above; a snippet of bounded cost for any text: the algorithm
    above applied to a window of ``WINDOW_CHARS`` characters that starts ``WINDOW_BEFORE``
    characters before the first instance of a marked phrase (the phrases of the groups'
    operands; every phrase without ``groups``), less a word token an edge of the window
    cuts, each marked phrase marked wherever it occurs in it, with the ellipsis where the
    window cuts the text. Search uses them past its size and instance limits (docs/search.md,
    "Bounds").

What it reproduces
------------------
- unicode61: token characters are ASCII letters and digits and, above ASCII, the
  characters FTS5's own category table puts in ``L*``, ``N*`` or ``Co``. That table
  predates recent Unicode versions and counts code points it does not know as token
  characters, so ``unicodedata`` is not used: ``²``, ``½``, ``①``, private-use characters
  and emoji such as ``🙂`` are token characters, while ``€``, ``©``, ``™``, ``✓`` or
  ``→`` separate. The 25 combining diacritics FTS5 removes continue a token but never
  start one (other combining marks separate); the underscore and every other ASCII
  character that is not a letter or digit separate tokens. Folding (lower case,
  diacritics removed) follows FTS5's table too. The tables below were measured from
  SQLite 3.40 itself, code point by code point (the tests check them again against the
  running SQLite).
- trigram: every run of three characters is a token, folded to lower case without removing
  diacritics; a NUL character ends the text.
- the snippet: FTS5 scores a window of ``tokens`` tokens at each phrase instance (1000 for
  each phrase seen first in it, 1 for a repeat) and at the start of the sentence holding it
  (a token after ``.`` or ``:`` and white space; 120 extra at the start of the text, 100
  elsewhere), keeps the first best, centres it on its hits, then copies the window's text
  with overlapping instances merged into one highlight. Positions are tokens, offsets UTF-8
  bytes, as in FTS5, including its quirks: ``tokens=1`` (and less) copies the whole text
  up to the last highlight; when a highlight starts inside the bytes of the previous one
  (trigram: ``"abc" OR "cde"`` on ``abcde``), FTS5 copies the rest of the text before
  opening it; a NUL byte cuts each piece of copied text.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "EXACT_INSTANCES",
    "WINDOW_BEFORE",
    "WINDOW_CHARS",
    "Group",
    "Near",
    "Phrase",
    "Term",
    "bounded_trigram_snippet",
    "bounded_word_snippet",
    "exact_is_bounded",
    "trigram_snippet",
    "word_snippet",
]

Term = tuple[str, bool]
Phrase = Sequence[Term]
Near = tuple[Sequence[int], int]
Group = tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]


# Tokenizer tables, measured from SQLite 3.40's FTS5 for every code point above ASCII.
# _CLASSES: "start:class" in hex, the class of every code point from that start to the
# next: 0 separator, 1 token character, 2 continues a token (a removable diacritic) but
# never starts one. The folds: "first:count:step:offset", a run of code points, each
# mapped to itself plus the offset ("x": dropped); code points in no run fold to
# themselves. The word fold (unicode61, remove_diacritics=1) lists token characters only.
_CLASSES = (
    "80:0 aa:1 ab:0 b2:1 b4:0 b5:1 b6:0 b9:1 bb:0 bc:1 bf:0 c0:1 d7:0 d8:1 f7:0 f8:1 2c2:0 "
    "2c6:1 2d2:0 2e0:1 2e5:0 2ec:1 2ed:0 2ee:1 2ef:0 300:2 305:0 306:2 30d:0 30f:2 310:0 "
    "311:2 312:0 31b:2 31c:0 323:2 329:0 32d:2 32f:0 330:2 332:0 370:1 375:0 376:1 37e:0 "
    "37f:1 384:0 386:1 387:0 388:1 3f6:0 3f7:1 482:0 48a:1 55a:0 560:1 589:0 58b:1 58f:0 "
    "590:1 591:0 5c8:1 5f3:0 5f5:1 600:0 605:1 606:0 61c:1 61e:0 620:1 64b:0 660:1 66a:0 "
    "66e:1 670:0 671:1 6d4:0 6d5:1 6d6:0 6e5:1 6e7:0 6ee:1 6fd:0 6ff:1 700:0 70e:1 70f:0 "
    "710:1 711:0 712:1 730:0 74b:1 7a6:0 7b1:1 7eb:0 7f4:1 7f6:0 7fa:1 816:0 81a:1 81b:0 "
    "824:1 825:0 828:1 829:0 82e:1 830:0 83f:1 859:0 85c:1 85e:0 85f:1 8e4:0 8ff:1 900:0 "
    "904:1 93a:0 93d:1 93e:0 950:1 951:0 958:1 962:0 966:1 970:0 971:1 981:0 984:1 9bc:0 "
    "9bd:1 9be:0 9c5:1 9c7:0 9c9:1 9cb:0 9ce:1 9d7:0 9d8:1 9e2:0 9e4:1 9f2:0 9f4:1 9fa:0 "
    "9fc:1 a01:0 a04:1 a3c:0 a3d:1 a3e:0 a43:1 a47:0 a49:1 a4b:0 a4e:1 a51:0 a52:1 a70:0 "
    "a72:1 a75:0 a76:1 a81:0 a84:1 abc:0 abd:1 abe:0 ac6:1 ac7:0 aca:1 acb:0 ace:1 ae2:0 "
    "ae4:1 af0:0 af2:1 b01:0 b04:1 b3c:0 b3d:1 b3e:0 b45:1 b47:0 b49:1 b4b:0 b4e:1 b56:0 "
    "b58:1 b62:0 b64:1 b70:0 b71:1 b82:0 b83:1 bbe:0 bc3:1 bc6:0 bc9:1 bca:0 bce:1 bd7:0 "
    "bd8:1 bf3:0 bfb:1 c01:0 c04:1 c3e:0 c45:1 c46:0 c49:1 c4a:0 c4e:1 c55:0 c57:1 c62:0 "
    "c64:1 c7f:0 c80:1 c82:0 c84:1 cbc:0 cbd:1 cbe:0 cc5:1 cc6:0 cc9:1 cca:0 cce:1 cd5:0 "
    "cd7:1 ce2:0 ce4:1 d02:0 d04:1 d3e:0 d45:1 d46:0 d49:1 d4a:0 d4e:1 d57:0 d58:1 d62:0 "
    "d64:1 d79:0 d7a:1 d82:0 d84:1 dca:0 dcb:1 dcf:0 dd5:1 dd6:0 dd7:1 dd8:0 de0:1 df2:0 "
    "df5:1 e31:0 e32:1 e34:0 e3b:1 e3f:0 e40:1 e47:0 e50:1 e5a:0 e5c:1 eb1:0 eb2:1 eb4:0 "
    "eba:1 ebb:0 ebd:1 ec8:0 ece:1 f01:0 f20:1 f34:0 f40:1 f71:0 f88:1 f8d:0 f98:1 f99:0 "
    "fbd:1 fbe:0 fcd:1 fce:0 fdb:1 102b:0 103f:1 104a:0 1050:1 1056:0 105a:1 105e:0 1061:1 "
    "1062:0 1065:1 1067:0 106e:1 1071:0 1075:1 1082:0 108e:1 108f:0 1090:1 109a:0 10a0:1 "
    "10fb:0 10fc:1 135d:0 1369:1 1390:0 139a:1 1400:0 1401:1 166d:0 166f:1 1680:0 1681:1 "
    "169b:0 169d:1 16eb:0 16ee:1 1712:0 1715:1 1732:0 1737:1 1752:0 1754:1 1772:0 1774:1 "
    "17b4:0 17d7:1 17d8:0 17dc:1 17dd:0 17de:1 1800:0 180f:1 18a9:0 18aa:1 1920:0 192c:1 "
    "1930:0 193c:1 1940:0 1941:1 1944:0 1946:1 19b0:0 19c1:1 19c8:0 19ca:1 19de:0 1a00:1 "
    "1a17:0 1a1c:1 1a1e:0 1a20:1 1a55:0 1a5f:1 1a60:0 1a7d:1 1a7f:0 1a80:1 1aa0:0 1aa7:1 "
    "1aa8:0 1aae:1 1b00:0 1b05:1 1b34:0 1b45:1 1b5a:0 1b7d:1 1b80:0 1b83:1 1ba1:0 1bae:1 "
    "1be6:0 1bf4:1 1bfc:0 1c00:1 1c24:0 1c38:1 1c3b:0 1c40:1 1c7e:0 1c80:1 1cc0:0 1cc8:1 "
    "1cd0:0 1ce9:1 1ced:0 1cee:1 1cf2:0 1cf5:1 1dc0:0 1de7:1 1dfc:0 1e00:1 1fbd:0 1fbe:1 "
    "1fbf:0 1fc2:1 1fcd:0 1fd0:1 1fdd:0 1fe0:1 1fed:0 1ff0:1 1ffd:0 1fff:1 2000:0 2065:1 "
    "206a:0 2070:1 207a:0 207f:1 208a:0 208f:1 20a0:0 20ba:1 20d0:0 20f1:1 2100:0 2102:1 "
    "2103:0 2107:1 2108:0 210a:1 2114:0 2115:1 2116:0 2119:1 211e:0 2124:1 2125:0 2126:1 "
    "2127:0 2128:1 2129:0 212a:1 212e:0 212f:1 213a:0 213c:1 2140:0 2145:1 214a:0 214e:1 "
    "214f:0 2150:1 2190:0 23f4:1 2400:0 2427:1 2440:0 244b:1 249c:0 24ea:1 2500:0 2700:1 "
    "2701:0 2776:1 2794:0 2b4d:1 2b50:0 2b5a:1 2ce5:0 2ceb:1 2cef:0 2cf2:1 2cf9:0 2cfd:1 "
    "2cfe:0 2d00:1 2d70:0 2d71:1 2d7f:0 2d80:1 2de0:0 2e2f:1 2e30:0 2e3c:1 2e80:0 2e9a:1 "
    "2e9b:0 2ef4:1 2f00:0 2fd6:1 2ff0:0 2ffc:1 3000:0 3005:1 3008:0 3021:1 302a:0 3031:1 "
    "3036:0 3038:1 303d:0 3040:1 3099:0 309d:1 30a0:0 30a1:1 30fb:0 30fc:1 3190:0 3192:1 "
    "3196:0 31a0:1 31c0:0 31e4:1 3200:0 321f:1 322a:0 3248:1 3250:0 3251:1 3260:0 3280:1 "
    "328a:0 32b1:1 32c0:0 32ff:1 3300:0 3400:1 4dc0:0 4e00:1 a490:0 a4c7:1 a4fe:0 a500:1 "
    "a60d:0 a610:1 a66f:0 a67f:1 a69f:0 a6a0:1 a6f0:0 a6f8:1 a700:0 a717:1 a720:0 a722:1 "
    "a789:0 a78b:1 a802:0 a803:1 a806:0 a807:1 a80b:0 a80c:1 a823:0 a82c:1 a836:0 a83a:1 "
    "a874:0 a878:1 a880:0 a882:1 a8b4:0 a8c5:1 a8ce:0 a8d0:1 a8e0:0 a8f2:1 a8f8:0 a8fb:1 "
    "a926:0 a930:1 a947:0 a954:1 a95f:0 a960:1 a980:0 a984:1 a9b3:0 a9ce:1 a9de:0 a9e0:1 "
    "aa29:0 aa37:1 aa43:0 aa44:1 aa4c:0 aa4e:1 aa5c:0 aa60:1 aa77:0 aa7a:1 aa7b:0 aa7c:1 "
    "aab0:0 aab1:1 aab2:0 aab5:1 aab7:0 aab9:1 aabe:0 aac0:1 aac1:0 aac2:1 aade:0 aae0:1 "
    "aaeb:0 aaf2:1 aaf5:0 aaf7:1 abe3:0 abee:1 d800:0 e000:1 fb1e:0 fb1f:1 fb29:0 fb2a:1 "
    "fbb2:0 fbc2:1 fd3e:0 fd40:1 fdfc:0 fdfe:1 fe00:0 fe1a:1 fe20:0 fe27:1 fe30:0 fe53:1 "
    "fe54:0 fe67:1 fe68:0 fe6c:1 feff:0 ff00:1 ff01:0 ff10:1 ff1a:0 ff21:1 ff3b:0 ff41:1 "
    "ff5b:0 ff66:1 ffe0:0 ffe7:1 ffe8:0 ffef:1 fff9:0 10000:1 10100:0 10103:1 10137:0 "
    "10140:1 10179:0 1018a:1 10190:0 1019c:1 101d0:0 101fe:1 1039f:0 103a0:1 103d0:0 103d1:1 "
    "10857:0 10858:1 1091f:0 10920:1 1093f:0 10940:1 10a01:0 10a04:1 10a05:0 10a07:1 10a0c:0 "
    "10a10:1 10a38:0 10a3b:1 10a3f:0 10a40:1 10a50:0 10a59:1 10a7f:0 10a80:1 10b39:0 10b40:1 "
    "11000:0 11003:1 11038:0 1104e:1 11080:0 11083:1 110b0:0 110c2:1 11100:0 11103:1 11127:0 "
    "11135:1 11140:0 11144:1 11180:0 11183:1 111b3:0 111c1:1 111c5:0 111c9:1 116ab:0 116b8:1 "
    "12470:0 12474:1 16f51:0 16f7f:1 16f8f:0 16f93:1 1d000:0 1d0f6:1 1d100:0 1d127:1 1d129:0 "
    "1d1de:1 1d200:0 1d246:1 1d300:0 1d357:1 1d6c1:0 1d6c2:1 1d6db:0 1d6dc:1 1d6fb:0 1d6fc:1 "
    "1d715:0 1d716:1 1d735:0 1d736:1 1d74f:0 1d750:1 1d76f:0 1d770:1 1d789:0 1d78a:1 1d7a9:0 "
    "1d7aa:1 1d7c3:0 1d7c4:1 1eef0:0 1eef2:1 1f000:0 1f02c:1 1f030:0 1f094:1 1f0a0:0 1f0af:1 "
    "1f0b1:0 1f0bf:1 1f0c1:0 1f0d0:1 1f0d1:0 1f0e0:1 1f110:0 1f12f:1 1f130:0 1f16c:1 1f170:0 "
    "1f19b:1 1f1e6:0 1f203:1 1f210:0 1f23b:1 1f240:0 1f249:1 1f250:0 1f252:1 1f300:0 1f321:1 "
    "1f330:0 1f336:1 1f337:0 1f37d:1 1f380:0 1f394:1 1f3a0:0 1f3c5:1 1f3c6:0 1f3cb:1 1f3e0:0 "
    "1f3f1:1 1f400:0 1f43f:1 1f440:0 1f441:1 1f442:0 1f4f8:1 1f4f9:0 1f4fd:1 1f500:0 1f53e:1 "
    "1f540:0 1f544:1 1f550:0 1f568:1 1f5fb:0 1f641:1 1f645:0 1f650:1 1f680:0 1f6c6:1 1f700:0 "
    "1f774:1 e0001:0 e0002:1 e0020:0 e0080:1 e0100:0 e01f0:1 "
)

_FOLD_REMOVING_DIACRITICS = (
    "b5:1:1:775 c0:1:1:-95 c1:1:1:-96 c2:1:1:-97 c3:1:1:-98 c4:1:1:-99 c5:1:1:-100 c6:1:1:32 "
    "c7:1:1:-100 c8:1:1:-99 c9:1:1:-100 ca:1:1:-101 cb:1:1:-102 cc:1:1:-99 cd:1:1:-100 "
    "ce:1:1:-101 cf:1:1:-102 d0:1:1:32 d1:2:1:-99 d3:1:1:-100 d4:1:1:-101 d5:1:1:-102 "
    "d6:1:1:-103 d8:1:1:32 d9:1:1:-100 da:1:1:-101 db:1:1:-102 dc:1:1:-103 dd:1:1:-100 "
    "de:1:1:32 e0:1:1:-127 e1:1:1:-128 e2:1:1:-129 e3:1:1:-130 e4:1:1:-131 e5:2:2:-132 "
    "e8:1:1:-131 e9:1:1:-132 ea:1:1:-133 eb:1:1:-134 ec:1:1:-131 ed:1:1:-132 ee:1:1:-133 "
    "ef:1:1:-134 f1:2:1:-131 f3:1:1:-132 f4:1:1:-133 f5:1:1:-134 f6:1:1:-135 f9:1:1:-132 "
    "fa:1:1:-133 fb:1:1:-134 fc:1:1:-135 fd:1:1:-132 ff:1:1:-134 100:1:1:-159 101:1:1:-160 "
    "102:1:1:-161 103:1:1:-162 104:1:1:-163 105:1:1:-164 106:1:1:-163 107:1:1:-164 "
    "108:1:1:-165 109:1:1:-166 10a:1:1:-167 10b:1:1:-168 10c:1:1:-169 10d:2:1:-170 "
    "10f:1:1:-171 110:1:1:1 112:1:1:-173 113:1:1:-174 114:1:1:-175 115:1:1:-176 116:1:1:-177 "
    "117:1:1:-178 118:1:1:-179 119:1:1:-180 11a:1:1:-181 11b:1:1:-182 11c:1:1:-181 "
    "11d:1:1:-182 11e:1:1:-183 11f:1:1:-184 120:1:1:-185 121:1:1:-186 122:1:1:-187 "
    "123:2:1:-188 125:1:1:-189 126:1:1:1 128:1:1:-191 129:1:1:-192 12a:1:1:-193 12b:1:1:-194 "
    "12c:1:1:-195 12d:1:1:-196 12e:1:1:-197 12f:1:1:-198 130:1:1:-199 132:1:1:1 134:1:1:-202 "
    "135:2:1:-203 137:1:1:-204 139:1:1:-205 13a:1:1:-206 13b:1:1:-207 13c:1:1:-208 "
    "13d:1:1:-209 13e:1:1:-210 13f:2:2:1 143:1:1:-213 144:1:1:-214 145:1:1:-215 146:1:1:-216 "
    "147:1:1:-217 148:1:1:-218 14a:1:1:1 14c:1:1:-221 14d:1:1:-222 14e:1:1:-223 14f:1:1:-224 "
    "150:1:1:-225 151:1:1:-226 152:1:1:1 154:1:1:-226 155:1:1:-227 156:1:1:-228 157:1:1:-229 "
    "158:1:1:-230 159:2:1:-231 15b:1:1:-232 15c:1:1:-233 15d:1:1:-234 15e:1:1:-235 "
    "15f:1:1:-236 160:1:1:-237 161:2:1:-238 163:1:1:-239 164:1:1:-240 165:1:1:-241 166:1:1:1 "
    "168:1:1:-243 169:1:1:-244 16a:1:1:-245 16b:1:1:-246 16c:1:1:-247 16d:1:1:-248 "
    "16e:1:1:-249 16f:1:1:-250 170:1:1:-251 171:1:1:-252 172:1:1:-253 173:1:1:-254 "
    "174:1:1:-253 175:1:1:-254 176:1:1:-253 177:1:1:-254 178:2:1:-255 17a:1:1:-256 "
    "17b:1:1:-257 17c:1:1:-258 17d:1:1:-259 17e:1:1:-260 17f:1:1:-268 181:1:1:210 182:2:2:1 "
    "186:1:1:206 187:1:1:1 189:2:1:205 18b:1:1:1 18e:1:1:79 18f:1:1:202 190:1:1:203 "
    "191:1:1:1 193:1:1:205 194:1:1:207 196:1:1:211 197:1:1:209 198:1:1:1 19c:1:1:211 "
    "19d:1:1:213 19f:1:1:214 1a0:1:1:-305 1a1:1:1:-306 1a2:2:2:1 1a6:1:1:218 1a7:1:1:1 "
    "1a9:1:1:218 1ac:1:1:1 1ae:1:1:218 1af:1:1:-314 1b0:1:1:-315 1b1:2:1:217 1b3:2:2:1 "
    "1b7:1:1:219 1b8:1:1:1 1bc:1:1:1 1c4:1:1:2 1c5:1:1:1 1c7:1:1:2 1c8:1:1:1 1ca:1:1:2 "
    "1cb:1:1:1 1cd:1:1:-364 1ce:1:1:-365 1cf:1:1:-358 1d0:1:1:-359 1d1:1:1:-354 1d2:1:1:-355 "
    "1d3:1:1:-350 1d4:1:1:-351 1d5:4:2:1 1de:4:2:1 1e6:1:1:-383 1e7:1:1:-384 1e8:1:1:-381 "
    "1e9:1:1:-382 1ea:1:1:-379 1eb:1:1:-380 1ec:2:2:1 1f0:1:1:-390 1f1:1:1:2 1f2:1:1:1 "
    "1f4:1:1:-397 1f5:1:1:-398 1f6:1:1:-97 1f7:1:1:-56 1f8:1:1:-394 1f9:1:1:-395 1fa:3:2:1 "
    "200:1:1:-415 201:1:1:-416 202:1:1:-417 203:1:1:-418 204:1:1:-415 205:1:1:-416 "
    "206:1:1:-417 207:1:1:-418 208:1:1:-415 209:1:1:-416 20a:1:1:-417 20b:1:1:-418 "
    "20c:1:1:-413 20d:1:1:-414 20e:1:1:-415 20f:1:1:-416 210:1:1:-414 211:1:1:-415 "
    "212:1:1:-416 213:1:1:-417 214:1:1:-415 215:1:1:-416 216:1:1:-417 217:1:1:-418 "
    "218:1:1:-421 219:2:1:-422 21b:1:1:-423 21c:1:1:1 21e:1:1:-438 21f:1:1:-439 220:1:1:-130 "
    "222:2:2:1 226:1:1:-453 227:1:1:-454 228:1:1:-451 229:1:1:-452 22a:2:2:1 22e:1:1:-447 "
    "22f:1:1:-448 230:1:1:1 232:1:1:-441 233:1:1:-442 23a:1:1:10795 23b:1:1:1 23d:1:1:-163 "
    "23e:1:1:10792 241:1:1:1 243:1:1:-195 244:1:1:69 245:1:1:71 246:5:2:1 300:1:1:x "
    "301:1:1:x 302:1:1:x 303:1:1:x 304:1:1:x 306:1:1:x 307:1:1:x 308:1:1:x 309:1:1:x "
    "30a:1:1:x 30b:1:1:x 30c:1:1:x 30f:1:1:x 311:1:1:x 31b:1:1:x 323:1:1:x 324:1:1:x "
    "325:1:1:x 326:1:1:x 327:1:1:x 328:1:1:x 32d:1:1:x 32e:1:1:x 330:1:1:x 331:1:1:x "
    "370:2:2:1 376:1:1:1 386:1:1:38 388:3:1:37 38c:1:1:64 38e:2:1:63 391:17:1:32 3a3:9:1:32 "
    "3c2:1:1:1 3cf:1:1:8 3d0:1:1:-30 3d1:1:1:-25 3d5:1:1:-15 3d6:1:1:-22 3d8:12:2:1 "
    "3f0:1:1:-54 3f1:1:1:-48 3f4:1:1:-60 3f5:1:1:-64 3f7:1:1:1 3f9:1:1:-7 3fa:1:1:1 "
    "3fd:3:1:-130 400:16:1:80 410:32:1:32 460:17:2:1 48a:27:2:1 4c0:1:1:15 4c1:7:2:1 "
    "4d0:44:2:1 531:38:1:48 10a0:38:1:7264 10c7:1:1:7264 10cd:1:1:7264 1e00:1:1:-7583 "
    "1e01:2:1:-7584 1e03:1:1:-7585 1e04:1:1:-7586 1e05:1:1:-7587 1e06:1:1:-7588 "
    "1e07:1:1:-7589 1e08:1:1:1 1e0a:1:1:-7590 1e0b:1:1:-7591 1e0c:1:1:-7592 1e0d:1:1:-7593 "
    "1e0e:1:1:-7594 1e0f:1:1:-7595 1e10:1:1:-7596 1e11:1:1:-7597 1e12:1:1:-7598 "
    "1e13:1:1:-7599 1e14:2:2:1 1e18:1:1:-7603 1e19:1:1:-7604 1e1a:1:1:-7605 1e1b:1:1:-7606 "
    "1e1c:1:1:1 1e1e:1:1:-7608 1e1f:2:1:-7609 1e21:2:1:-7610 1e23:1:1:-7611 1e24:1:1:-7612 "
    "1e25:1:1:-7613 1e26:1:1:-7614 1e27:1:1:-7615 1e28:1:1:-7616 1e29:1:1:-7617 "
    "1e2a:1:1:-7618 1e2b:2:1:-7619 1e2d:1:1:-7620 1e2e:1:1:1 1e30:1:1:-7621 1e31:1:1:-7622 "
    "1e32:1:1:-7623 1e33:1:1:-7624 1e34:1:1:-7625 1e35:2:1:-7626 1e37:1:1:-7627 1e38:1:1:1 "
    "1e3a:1:1:-7630 1e3b:1:1:-7631 1e3c:1:1:-7632 1e3d:2:1:-7633 1e3f:1:1:-7634 "
    "1e40:1:1:-7635 1e41:1:1:-7636 1e42:1:1:-7637 1e43:2:1:-7638 1e45:1:1:-7639 "
    "1e46:1:1:-7640 1e47:1:1:-7641 1e48:1:1:-7642 1e49:1:1:-7643 1e4a:1:1:-7644 "
    "1e4b:1:1:-7645 1e4c:4:2:1 1e54:1:1:-7652 1e55:1:1:-7653 1e56:1:1:-7654 1e57:1:1:-7655 "
    "1e58:1:1:-7654 1e59:1:1:-7655 1e5a:1:1:-7656 1e5b:1:1:-7657 1e5c:1:1:1 1e5e:1:1:-7660 "
    "1e5f:2:1:-7661 1e61:1:1:-7662 1e62:1:1:-7663 1e63:1:1:-7664 1e64:3:2:1 1e6a:1:1:-7670 "
    "1e6b:1:1:-7671 1e6c:1:1:-7672 1e6d:1:1:-7673 1e6e:1:1:-7674 1e6f:1:1:-7675 "
    "1e70:1:1:-7676 1e71:2:1:-7677 1e73:1:1:-7678 1e74:1:1:-7679 1e75:1:1:-7680 "
    "1e76:1:1:-7681 1e77:1:1:-7682 1e78:2:2:1 1e7c:1:1:-7686 1e7d:1:1:-7687 1e7e:1:1:-7688 "
    "1e7f:2:1:-7689 1e81:1:1:-7690 1e82:1:1:-7691 1e83:1:1:-7692 1e84:1:1:-7693 "
    "1e85:1:1:-7694 1e86:1:1:-7695 1e87:1:1:-7696 1e88:1:1:-7697 1e89:2:1:-7698 "
    "1e8b:1:1:-7699 1e8c:1:1:-7700 1e8d:2:1:-7701 1e8f:2:1:-7702 1e91:1:1:-7703 "
    "1e92:1:1:-7704 1e93:1:1:-7705 1e94:1:1:-7706 1e95:1:1:-7707 1e96:1:1:-7726 "
    "1e97:1:1:-7715 1e98:1:1:-7713 1e99:1:1:-7712 1e9b:1:1:-7720 1e9e:1:1:-7615 "
    "1ea0:1:1:-7743 1ea1:1:1:-7744 1ea2:1:1:-7745 1ea3:1:1:-7746 1ea4:10:2:1 1eb8:1:1:-7763 "
    "1eb9:1:1:-7764 1eba:1:1:-7765 1ebb:1:1:-7766 1ebc:1:1:-7767 1ebd:1:1:-7768 1ebe:5:2:1 "
    "1ec8:1:1:-7775 1ec9:1:1:-7776 1eca:1:1:-7777 1ecb:1:1:-7778 1ecc:1:1:-7773 "
    "1ecd:1:1:-7774 1ece:1:1:-7775 1ecf:1:1:-7776 1ed0:10:2:1 1ee4:1:1:-7791 1ee5:1:1:-7792 "
    "1ee6:1:1:-7793 1ee7:1:1:-7794 1ee8:5:2:1 1ef2:1:1:-7801 1ef3:1:1:-7802 1ef4:1:1:-7803 "
    "1ef5:1:1:-7804 1ef6:1:1:-7805 1ef7:1:1:-7806 1ef8:1:1:-7807 1ef9:1:1:-7808 1efa:3:2:1 "
    "1f08:8:1:-8 1f18:6:1:-8 1f28:8:1:-8 1f38:8:1:-8 1f48:6:1:-8 1f59:4:2:-8 1f68:8:1:-8 "
    "1f88:8:1:-8 1f98:8:1:-8 1fa8:8:1:-8 1fb8:2:1:-8 1fba:2:1:-74 1fbc:1:1:-9 1fbe:1:1:-7173 "
    "1fc8:4:1:-86 1fcc:1:1:-9 1fd8:2:1:-8 1fda:2:1:-100 1fe8:2:1:-8 1fea:2:1:-112 "
    "1fec:1:1:-7 1ff8:2:1:-128 1ffa:2:1:-126 1ffc:1:1:-9 2126:1:1:-7517 212a:1:1:-8383 "
    "212b:1:1:-8394 2132:1:1:28 2160:16:1:16 2183:1:1:1 2c00:47:1:48 2c60:1:1:1 "
    "2c62:1:1:-10743 2c63:1:1:-3814 2c64:1:1:-10727 2c67:3:2:1 2c6d:1:1:-10780 "
    "2c6e:1:1:-10749 2c6f:1:1:-10783 2c70:1:1:-10782 2c72:1:1:1 2c75:1:1:1 2c7e:2:1:-10815 "
    "2c80:50:2:1 2ceb:2:2:1 2cf2:1:1:1 a640:23:2:1 a680:12:2:1 a722:7:2:1 a732:31:2:1 "
    "a779:2:2:1 a77d:1:1:-35332 a77e:5:2:1 a78b:1:1:1 a78d:1:1:-42280 a790:2:2:1 a7a0:5:2:1 "
    "a7aa:1:1:-42308 ff21:26:1:32 10400:40:1:40 "
)

_FOLD_KEEPING_DIACRITICS = (
    "b5:1:1:775 c0:23:1:32 d8:7:1:32 100:24:2:1 132:3:2:1 139:8:2:1 14a:23:2:1 178:1:1:-121 "
    "179:3:2:1 17f:1:1:-268 181:1:1:210 182:2:2:1 186:1:1:206 187:1:1:1 189:2:1:205 "
    "18b:1:1:1 18e:1:1:79 18f:1:1:202 190:1:1:203 191:1:1:1 193:1:1:205 194:1:1:207 "
    "196:1:1:211 197:1:1:209 198:1:1:1 19c:1:1:211 19d:1:1:213 19f:1:1:214 1a0:3:2:1 "
    "1a6:1:1:218 1a7:1:1:1 1a9:1:1:218 1ac:1:1:1 1ae:1:1:218 1af:1:1:1 1b1:2:1:217 1b3:2:2:1 "
    "1b7:1:1:219 1b8:1:1:1 1bc:1:1:1 1c4:1:1:2 1c5:1:1:1 1c7:1:1:2 1c8:1:1:1 1ca:1:1:2 "
    "1cb:9:2:1 1de:9:2:1 1f1:1:1:2 1f2:2:2:1 1f6:1:1:-97 1f7:1:1:-56 1f8:20:2:1 220:1:1:-130 "
    "222:9:2:1 23a:1:1:10795 23b:1:1:1 23d:1:1:-163 23e:1:1:10792 241:1:1:1 243:1:1:-195 "
    "244:1:1:69 245:1:1:71 246:5:2:1 345:1:1:116 370:2:2:1 376:1:1:1 386:1:1:38 388:3:1:37 "
    "38c:1:1:64 38e:2:1:63 391:17:1:32 3a3:9:1:32 3c2:1:1:1 3cf:1:1:8 3d0:1:1:-30 "
    "3d1:1:1:-25 3d5:1:1:-15 3d6:1:1:-22 3d8:12:2:1 3f0:1:1:-54 3f1:1:1:-48 3f4:1:1:-60 "
    "3f5:1:1:-64 3f7:1:1:1 3f9:1:1:-7 3fa:1:1:1 3fd:3:1:-130 400:16:1:80 410:32:1:32 "
    "460:17:2:1 48a:27:2:1 4c0:1:1:15 4c1:7:2:1 4d0:44:2:1 531:38:1:48 10a0:38:1:7264 "
    "10c7:1:1:7264 10cd:1:1:7264 1e00:75:2:1 1e9b:1:1:-58 1e9e:1:1:-7615 1ea0:48:2:1 "
    "1f08:8:1:-8 1f18:6:1:-8 1f28:8:1:-8 1f38:8:1:-8 1f48:6:1:-8 1f59:4:2:-8 1f68:8:1:-8 "
    "1f88:8:1:-8 1f98:8:1:-8 1fa8:8:1:-8 1fb8:2:1:-8 1fba:2:1:-74 1fbc:1:1:-9 1fbe:1:1:-7173 "
    "1fc8:4:1:-86 1fcc:1:1:-9 1fd8:2:1:-8 1fda:2:1:-100 1fe8:2:1:-8 1fea:2:1:-112 "
    "1fec:1:1:-7 1ff8:2:1:-128 1ffa:2:1:-126 1ffc:1:1:-9 2126:1:1:-7517 212a:1:1:-8383 "
    "212b:1:1:-8262 2132:1:1:28 2160:16:1:16 2183:1:1:1 24b6:26:1:26 2c00:47:1:48 2c60:1:1:1 "
    "2c62:1:1:-10743 2c63:1:1:-3814 2c64:1:1:-10727 2c67:3:2:1 2c6d:1:1:-10780 "
    "2c6e:1:1:-10749 2c6f:1:1:-10783 2c70:1:1:-10782 2c72:1:1:1 2c75:1:1:1 2c7e:2:1:-10815 "
    "2c80:50:2:1 2ceb:2:2:1 2cf2:1:1:1 a640:23:2:1 a680:12:2:1 a722:7:2:1 a732:31:2:1 "
    "a779:2:2:1 a77d:1:1:-35332 a77e:5:2:1 a78b:1:1:1 a78d:1:1:-42280 a790:2:2:1 a7a0:5:2:1 "
    "a7aa:1:1:-42308 ff21:26:1:32 fffe:1:1:-1 ffff:1:1:-2 10400:40:1:40 "
)


def _classes(table: str) -> tuple[list[int], list[int]]:
    starts: list[int] = []
    kinds: list[int] = []
    for item in table.split():
        first, kind = item.split(":")
        starts.append(int(first, 16))
        kinds.append(int(kind))
    return starts, kinds


def _expand(table: str) -> dict[int, str]:
    folded: dict[int, str] = {}
    for item in table.split():
        first, count, step, offset = item.split(":")
        begin, stride = int(first, 16), int(step)
        for code in range(begin, begin + int(count) * stride, stride):
            folded[code] = "" if offset == "x" else chr(code + int(offset))
    return folded


_CLASS_STARTS, _CLASS_KINDS = _classes(_CLASSES)
_FOLD_WORD = _expand(_FOLD_REMOVING_DIACRITICS)
_FOLD_TRIGRAM = _expand(_FOLD_KEEPING_DIACRITICS)
_SEPARATOR, _TOKEN = 0, 1  # 2: continues a token, never starts one


def _fold_trigram(ch: str) -> str:
    if ch < "\x80":
        return ch.lower()
    return _FOLD_TRIGRAM.get(ord(ch), ch)


def _utf8_len(ch: str) -> int:
    code = ord(ch)
    return 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4


class _Token(NamedTuple):
    text: str
    start: int  # UTF-8 byte offset of its first byte
    end: int  # UTF-8 byte offset just past its last byte


def _class_ranges(kind: int) -> str:
    """The code points of one unicode61 class above ASCII, as a regular expression class."""
    pieces = []
    for i, (first, klass) in enumerate(zip(_CLASS_STARTS, _CLASS_KINDS, strict=True)):
        if klass == kind:
            last = _CLASS_STARTS[i + 1] - 1 if i + 1 < len(_CLASS_STARTS) else 0x10FFFF
            pieces.append(f"\\U{first:08x}-\\U{last:08x}")
    return "".join(pieces)


#: unicode61's token characters and removable diacritics, as regular expression classes.
_TOKEN_CHARS = "0-9A-Za-z" + _class_ranges(_TOKEN)
_DIACRITICS = _class_ranges(2)
#: A token: a token character, then token characters or diacritics (which start none).
_WORD_TOKEN = re.compile(f"[{_TOKEN_CHARS}][{_TOKEN_CHARS}{_DIACRITICS}]*")
_ASCII_TOKEN = re.compile("[0-9A-Za-z]+")
#: unicode61's folding of every character that does not fold to itself.
_WORD_FOLDS = {
    **{code: folded for code, folded in _FOLD_WORD.items()},
    **{ord(ch): ch.lower() for ch in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"},
}


def _word_tokens(text: str) -> list[_Token]:
    """Tokenize like unicode61 (remove_diacritics=1, no tokenchars or separators)."""
    if text.isascii():  # offsets in characters are offsets in bytes
        return [
            _Token(match.group().lower(), match.start(), match.end())
            for match in _ASCII_TOKEN.finditer(text)
        ]
    tokens: list[_Token] = []
    chars = offset = 0  # the last token's end, in characters and in UTF-8 bytes
    for match in _WORD_TOKEN.finditer(text):
        begin, end = match.span()
        start = offset + _utf8_size(text[chars:begin])
        offset = start + _utf8_size(match.group())
        chars = end
        tokens.append(_Token(match.group().translate(_WORD_FOLDS), start, offset))
    return tokens


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _trigram_tokens(text: str) -> list[_Token]:
    """Tokenize like trigram (case_sensitive=0): one token per run of three characters."""
    cut = text.find("\x00")
    if cut >= 0:
        text = text[:cut]
    folded = [_fold_trigram(ch) for ch in text]
    offsets = [0]
    for ch in text:
        offsets.append(offsets[-1] + _utf8_len(ch))
    return [
        _Token("".join(folded[i : i + 3]), offsets[i], offsets[i + 3]) for i in range(len(text) - 2)
    ]


# --- phrase instances -------------------------------------------------------------------

_Pattern = list[tuple[str, bool]]  # folded tokens of a phrase, each with its prefix flag


def _word_pattern(phrase: Phrase) -> _Pattern:
    pattern: _Pattern = []
    for text, prefix in phrase:
        pattern.extend((token.text, False) for token in _word_tokens(text))
        # FTS5 sets (or clears) the prefix flag of the phrase's last token so far, even
        # when this string brought no token of its own.
        if pattern:
            pattern[-1] = (pattern[-1][0], prefix)
    return pattern


def _positions(doc: list[str], pattern: _Pattern) -> list[int]:
    """Every position where the phrase's tokens follow one another in the document."""
    if not pattern:
        return []
    size = len(pattern)
    found = []
    for pos in range(len(doc) - size + 1):
        for k, (want, prefix) in enumerate(pattern):
            have = doc[pos + k]
            if not (have.startswith(want) if prefix else have == want):
                break
        else:
            found.append(pos)
    return found


def _trim_near(lists: list[list[int]], sizes: list[int], distance: int) -> list[list[int]]:
    """Keep the instances of each phrase of a NEAR group that take part in a match.

    The same sweep as FTS5: a cursor per phrase; find a set of current instances that all
    lie within ``distance`` tokens (plus the phrase's own length) of the latest one, record
    them, then step the cursor whose next instance comes first.
    """
    count = len(lists)
    if count < 2:
        return lists
    kept: list[list[int]] = [[] for _ in lists]
    if any(not positions for positions in lists):
        return kept
    cursor = [0] * count

    def ahead(i: int) -> float:
        nxt = cursor[i] + 1
        return lists[i][nxt] if nxt < len(lists[i]) else float("inf")

    while True:
        latest = lists[0][cursor[0]]
        settled = False
        while not settled:
            settled = True
            for i in range(count):
                lowest = latest - sizes[i] - distance
                here = lists[i][cursor[i]]
                if here < lowest or here > latest:
                    settled = False
                    while lists[i][cursor[i]] < lowest:
                        cursor[i] += 1
                        if cursor[i] == len(lists[i]):
                            return kept
                    latest = max(latest, lists[i][cursor[i]])
        for i in range(count):
            here = lists[i][cursor[i]]
            if not kept[i] or kept[i][-1] != here:
                kept[i].append(here)
        step = 0
        for i in range(1, count):
            if ahead(i) < ahead(step):
                step = i
        cursor[step] += 1
        if cursor[step] == len(lists[step]):
            return kept


_Partial = dict[frozenset[int], dict[int, list[int]]]


def _counting(
    lists: list[list[int]],
    sizes: list[int],
    groups: Sequence[Group] | None,
    partial: _Partial | None = None,
) -> list[list[int]]:
    """Empty the instance lists of the phrases that do not count on this row.

    A phrase with no token (a quoted string of separators) is dropped by FTS5 from its
    operand; an operand left with none matches nothing. ``partial`` holds, for each NEAR
    group left half-tested on this row, the instances FTS5 still reports (see
    ``_half_tested``): they count when the group is an operand of its own, an OR branch or
    the right side of a NOT (no AND above it clears them).
    """
    if groups is None:
        return lists
    counted: dict[int, list[int]] = {}
    for required, forbidden in groups:
        operands = [[i for i in operand if sizes[i]] for operand in required]
        if not operands or not all(operands):
            continue  # an operand left without tokens matches nothing
        negated = [[i for i in operand if sizes[i]] for operand in forbidden]
        if any(operand and all(lists[i] for i in operand) for operand in negated):
            continue
        if all(lists[i] for operand in operands for i in operand):
            counted.update((i, lists[i]) for operand in operands for i in operand)
            # A half-tested NEAR group that is a NOT operand of its own stays on the row.
            for operand in negated:
                counted.update((partial or {}).get(frozenset(operand), {}))
        elif partial and len(operands) == 1 and frozenset(operands[0]) in partial:
            counted.update(partial[frozenset(operands[0])])
    return [counted.get(i, []) for i in range(len(lists))]


def _half_tested(
    words: list[str], patterns: list[_Pattern], lists: list[list[int]], members: list[int]
) -> dict[int, list[int]]:
    """What FTS5 still reports of a NEAR group that did not match the row.

    When every token of the group occurs in the row, FTS5 tests its phrases in order and
    stops at the first one that does not occur as a phrase; those tested before keep all
    of their instances. Unless an AND above it clears them, they show in the snippet.
    """
    vocabulary = set(words)

    def present(token: str, prefix: bool) -> bool:
        if not prefix:
            return token in vocabulary
        return any(word.startswith(token) for word in vocabulary)

    if not all(present(*term) for i in members for term in patterns[i]):
        return {}
    for j, i in enumerate(members):
        if not lists[i]:
            return {k: lists[k] for k in members[:j]}
    return {}


# --- the snippet ------------------------------------------------------------------------


class _Instance(NamedTuple):
    pos: int
    phrase: int
    size: int


def _instances(lists: list[list[int]], sizes: list[int]) -> list[_Instance]:
    """All instances in FTS5's xInst order: by position, then by phrase number."""
    return sorted(
        _Instance(pos, phrase, sizes[phrase])
        for phrase, positions in enumerate(lists)
        for pos in positions
    )


def _cdiv2(value: int) -> int:
    """``value / 2`` rounded toward zero, as C divides."""
    return value // 2 if value >= 0 else -((-value) // 2)


def _window_score(
    insts: list[_Instance],
    starts: list[int],
    phrases: list[list[int]],
    first: int,
    tokens: int,
    doc_size: int,
) -> tuple[int, int]:
    """Score the window of ``tokens`` tokens from ``first``, and where to centre it.

    ``starts`` are the instances' positions and ``phrases`` each phrase's own, to find the
    window's instances by bisection (FTS5 scans them all: 1000 for each phrase seen first
    in the window, 1 for each repeat, the same sum).
    """
    low = bisect.bisect_left(starts, first)
    high = bisect.bisect_left(starts, first + tokens) if tokens > 0 else low
    if high - low <= len(phrases):
        seen = len({inst.phrase for inst in insts[low:high]})
    else:
        seen = sum(
            bisect.bisect_left(own, first) < bisect.bisect_left(own, first + tokens)
            for own in phrases
        )
    score = 1000 * seen + (high - low - seen)
    lead, last = -1, 0  # no instance in the window: FTS5's initial values
    if low < high:
        lead = starts[low]
        last = insts[high - 1].pos + insts[high - 1].size
    centred = lead - _cdiv2(tokens - (last - lead))
    if centred + tokens > doc_size:
        centred = doc_size - tokens
    return score, max(centred, 0)


def _sentence_starts(data: bytes, doc: list[_Token]) -> list[int]:
    starts: list[int] = []
    for pos, token in enumerate(doc):
        if pos == 0:
            starts.append(0)
            continue
        i = token.start - 1
        while i >= 0 and data[i] in b" \t\n\r":
            i -= 1
        if i != token.start - 1 and i >= 0 and data[i] in b".:":
            starts.append(pos)
    return starts


def _best_start(data: bytes, doc: list[_Token], insts: list[_Instance], tokens: int) -> int:
    doc_size = len(doc)
    starts = _sentence_starts(data, doc)
    best_score = 0
    best_start = 0
    positions = [inst.pos for inst in insts]
    phrases: dict[int, list[int]] = {}
    for inst in insts:
        phrases.setdefault(inst.phrase, []).append(inst.pos)
    own = list(phrases.values())
    previous = -1
    for inst in insts:
        if inst.pos == previous:  # the same windows as the instance before: no better score
            continue
        previous = inst.pos
        score, centred = _window_score(insts, positions, own, inst.pos, tokens, doc_size)
        if score > best_score:
            best_score, best_start = score, centred
        if starts and doc_size > tokens:
            sentence = starts[bisect.bisect_right(starts, inst.pos) - 1]
            if sentence < inst.pos:
                score, _ = _window_score(insts, positions, own, sentence, tokens, doc_size)
                score += 120 if sentence == 0 else 100
                if score > best_score:
                    best_score, best_start = score, sentence
    return best_start


def _merged(insts: list[_Instance]) -> list[tuple[int, int]]:
    """Instances merged where they share tokens: (first token, last token) of each."""
    merged: list[tuple[int, int]] = []
    for inst in insts:
        last = inst.pos + inst.size - 1
        if merged and inst.pos <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((inst.pos, last))
    return merged


class _Output:
    """The result as FTS5 builds it: C strings, so a piece stops at its first NUL byte."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.parts: list[bytes] = []

    def add(self, piece: bytes) -> None:
        self.parts.append(piece.split(b"\x00", 1)[0])

    def copy(self, begin: int, end: int) -> None:
        # A negative length makes FTS5 copy everything up to the end of the text.
        self.add(self.data[begin:end] if end >= begin else self.data[begin:])


def _render(
    data: bytes,
    doc: list[_Token],
    insts: list[_Instance],
    tokens: int,
    marks: tuple[bytes, bytes, bytes],
    cut: tuple[bool, bool] = (False, False),
) -> str:
    """FTS5's snippet of ``data``; ``cut`` says whether the text went on before and after
    ``data`` (a bounded snippet's window, cut at tokens): an ellipsis stands for that text,
    as FTS5 writes one for the tokens it leaves out."""
    start_mark, end_mark, ellipsis = marks
    cut_before, cut_after = cut
    best = _best_start(data, doc, insts, tokens)
    range_start, range_end = best, best + tokens - 1
    merged = [span for span in _merged(insts) if span[0] >= best]
    out = _Output(data)
    if best > 0 or cut_before:
        out.add(ellipsis)
    k = 0
    span = merged[0] if merged else (-1, -1)
    offset = 0
    for pos, token in enumerate(doc):
        if range_end > 0:
            if pos < range_start or pos > range_end:
                continue
            if (range_start or cut_before) and pos == range_start:
                offset = token.start
        if pos == span[0]:
            out.copy(offset, token.start)
            out.add(start_mark)
            offset = token.start
        if pos == span[1]:
            if range_end and span[0] < range_start:
                out.add(start_mark)
            out.copy(offset, token.end)
            out.add(end_mark)
            offset = token.end
            k += 1
            span = merged[k] if k < len(merged) else (-1, -1)
        if range_end > 0 and pos == range_end:
            out.copy(offset, token.end)
            offset = token.end
            if span[0] <= pos < span[1]:
                out.add(end_mark)
    if range_end < len(doc) - 1:
        out.add(ellipsis)
    elif cut_after:
        if doc and doc[-1].end > offset:
            out.copy(offset, doc[-1].end)
        out.add(ellipsis)
    else:
        out.copy(offset, len(data))
    return b"".join(out.parts).decode("utf-8", "replace")


def _snippet(
    text: str,
    doc: list[_Token],
    lists: list[list[int]],
    sizes: list[int],
    tokens: int,
    marks: tuple[str, str, str],
    cut: tuple[bool, bool] = (False, False),
) -> str:
    data = text.encode("utf-8", "surrogatepass")
    encoded = (marks[0].encode(), marks[1].encode(), marks[2].encode())
    return _render(data, doc, _instances(lists, sizes), tokens, encoded, cut)


def _word_instances(
    text: str, phrases: Sequence[Phrase], near: Sequence[Near]
) -> tuple[list[_Token], list[list[int]], list[int], _Partial]:
    """The document's tokens, each phrase's instances after NEAR trimming, each phrase's
    size in tokens, and what half-tested NEAR groups still report."""
    doc = _word_tokens(text)
    words = [token.text for token in doc]
    patterns = [_word_pattern(phrase) for phrase in phrases]
    sizes = [len(pattern) for pattern in patterns]
    lists = [_positions(words, pattern) for pattern in patterns]
    partial: _Partial = {}
    for group, distance in near:
        members = [i for i in group if sizes[i]]
        trimmed = _trim_near([lists[i] for i in members], [sizes[i] for i in members], distance)
        if len(members) > 1 and not any(trimmed):
            partial[frozenset(members)] = _half_tested(words, patterns, lists, members)
        for i, positions in zip(members, trimmed, strict=True):
            lists[i] = positions
    return doc, lists, sizes, partial


def word_snippet(
    text: str,
    phrases: Sequence[Phrase],
    *,
    near: Sequence[Near] = (),
    groups: Sequence[Group] | None = None,
    tokens: int = 40,
    start: str = ">>>",
    end: str = "<<<",
    ellipsis: str = "...",
) -> str:
    """What ``snippet(fts, 0, start, end, ellipsis, tokens)`` returns on a unicode61 index.

    ``text`` is the indexed text of the row; ``phrases``, ``near`` and ``groups`` describe
    the query (see the module docstring).
    """
    doc, lists, sizes, partial = _word_instances(text, phrases, near)
    lists = _counting(lists, sizes, groups, partial)
    return _snippet(text, doc, lists, sizes, tokens, (start, end, ellipsis))


def trigram_snippet(
    text: str,
    substrings: Sequence[str],
    *,
    groups: Sequence[Group] | None = None,
    tokens: int = 40,
    start: str = ">>>",
    end: str = "<<<",
    ellipsis: str = "...",
) -> str:
    """What ``snippet(fts, 0, start, end, ellipsis, tokens)`` returns on a trigram index.

    ``substrings`` are the quoted tokens of the MATCH expression, in query order; ``groups``
    as for :func:`word_snippet`, with indexes into ``substrings``.
    """
    doc = _trigram_tokens(text)
    grams = [token.text for token in doc]
    patterns: list[_Pattern] = [
        [(token.text, False) for token in _trigram_tokens(sub)] for sub in substrings
    ]
    sizes = [len(pattern) for pattern in patterns]
    lists = _counting([_positions(grams, pattern) for pattern in patterns], sizes, groups)
    return _snippet(text, doc, lists, sizes, tokens, (start, end, ellipsis))


# --- bounded snippets -------------------------------------------------------------------
# FTS5 scores a window at every instance of the query's phrases against every other
# instance: its time grows with the square of the instances in the row (a 1 MB text full
# of the term took 5 s, 10 MB over 10 minutes). Search asks for FTS5's own snippet only
# where that stays small, and makes the others here, from a window of the text.

#: The most instances of a query's phrases a text may hold for its snippet to be FTS5's
#: own (FTS5's time for 1,000: about 10 ms).
EXACT_INSTANCES = 1000
#: A bounded snippet's window, in characters of the indexed text: it starts WINDOW_BEFORE
#: characters before the first instance of a marked phrase (or at the text's start).
WINDOW_CHARS = 16384
WINDOW_BEFORE = 2048

_WORDISH = f"{_TOKEN_CHARS}{_DIACRITICS}"
_WORDISH_CHAR = re.compile(f"[{_WORDISH}]")
_WORDISH_RUN = re.compile(f"[{_WORDISH}]*")
_WORDISH_TAIL = re.compile(f"[{_WORDISH}]+\\Z")


def _reverse(folds: dict[int, str]) -> dict[str, str]:
    """Each folded character -> the characters that fold to it, itself included."""
    sources: dict[str, set[str]] = {}
    for code, folded in folds.items():
        if folded:
            sources.setdefault(folded, {folded}).add(chr(code))
    return {folded: "".join(sorted(chars)) for folded, chars in sources.items()}


_WORD_SOURCES = _reverse(_WORD_FOLDS)
_TRIGRAM_SOURCES = _reverse(
    {**_FOLD_TRIGRAM, **{ord(ch): ch.lower() for ch in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"}}
)


def _either(folded: str, sources: dict[str, str]) -> str:
    """A regular expression class of the characters that fold to ``folded``."""
    return "[" + "".join(re.escape(ch) for ch in sources.get(folded, folded)) + "]"


def _word_regex(pattern: _Pattern, ascii_text: bool) -> str | None:
    """A regular expression finding where the phrase's instances start in a text, as
    unicode61 tokenises and folds it (in an ASCII text lower-cased: ASCII classes only);
    None when the phrase cannot occur in such a text."""
    if ascii_text:
        if not all(_ASCII_TOKEN.fullmatch(text) for text, _prefix in pattern):
            return None
        words = [re.escape(text) for text, _prefix in pattern]
        separators, wordish = "[^0-9a-z]+", "[0-9a-z]"
        # The first token as a literal (a fast search), then that it starts a token.
        first = f"{words[0]}(?<!{wordish}{words[0]})"
    else:
        diacritics = f"[{_DIACRITICS}]*"
        words = [
            "".join(_either(ch, _WORD_SOURCES) + diacritics for ch in text)
            for text, _prefix in pattern
        ]
        # Between two tokens: a separator, then anything but a token character (a
        # diacritic after a separator separates).
        separators, wordish = f"[^{_WORDISH}][^{_TOKEN_CHARS}]*", f"[{_WORDISH}]"
        head = _either(pattern[0][0][0], _WORD_SOURCES)
        # A token starts after a character that is neither a token character nor a
        # diacritic (which continues a token), and after any diacritics that follow it.
        start = f"(?:{head}(?<!{wordish}.)|[{_DIACRITICS}](?<!{wordish}.){diacritics}{head})"
        first = start + words[0][len(head) :]
    last = len(pattern) - 1
    # A whole token ends before a token character; a prefix goes on to its token's end,
    # unless it is the phrase's last.
    ends = [
        "" if prefix and k == last else f"{wordish}*" if prefix else f"(?!{wordish})"
        for k, (_text, prefix) in enumerate(pattern)
    ]
    rest = "".join(separators + words[k] + ends[k] for k in range(1, len(pattern)))
    return first + ends[0] + rest


def _trigram_regex(substring: str, ascii_text: bool) -> str | None:
    """A regular expression finding a quoted trigram token in a text, folded as the trigram
    tokenizer folds (in an ASCII text lower-cased)."""
    folded = "".join(_fold_trigram(ch) for ch in substring)
    if len(folded) < 3:
        return None
    if ascii_text:
        return re.escape(folded) if folded.isascii() else None
    return "".join(
        re.escape(ch) if _TRIGRAM_SOURCES.get(ch, ch) == ch else _either(ch, _TRIGRAM_SOURCES)
        for ch in folded
    )


_compiled = functools.lru_cache(maxsize=256)(re.compile)


class _Finder:
    """Where a query's phrases occur in one text, by regular expressions (the tokenizer in
    Python takes about a second a megabyte)."""

    def __init__(self, text: str, phrases: Sequence[Phrase] | Sequence[str], trigram: bool):
        ascii_text = text.isascii()
        if trigram:
            cut = text.find("\x00")  # the trigram tokenizer stops at a NUL
            text = text if cut < 0 else text[:cut]
            regexes = [_trigram_regex(str(sub), ascii_text) for sub in phrases]
        else:
            patterns = [_word_pattern(phrase) for phrase in phrases]  # type: ignore[arg-type]
            regexes = [_word_regex(p, ascii_text) if p else None for p in patterns]
        self.text = text.lower() if ascii_text else text
        self.finders = [_compiled(regex) if regex else None for regex in regexes]

    def first(self, marked: Sequence[int]) -> int | None:
        """The character offset of the first instance of a marked phrase, if any."""
        found = [
            match.start()
            for i in marked
            if (finder := self.finders[i]) is not None
            and (match := finder.search(self.text)) is not None
        ]
        return min(found, default=None)

    def more_than(self, limit: int) -> bool:
        """Whether the phrases have more than ``limit`` instances in all."""
        count = 0
        for finder in self.finders:
            if finder is None:
                continue
            match = finder.search(self.text)
            while match is not None:
                count += 1
                if count > limit:
                    return True
                match = finder.search(self.text, match.start() + 1)
        return False


def _marked(count: int, groups: Sequence[Group] | None) -> list[int]:
    """The phrases a bounded snippet marks: all of them, or those of a group's operands
    (never the right side of a NOT)."""
    if groups is None:
        return list(range(count))
    return sorted({i for operands, _negated in groups for operand in operands for i in operand})


def _window(text: str, anchor: int | None, *, words: bool) -> tuple[int, int]:
    """A bounded snippet's window (character offsets): WINDOW_CHARS from WINDOW_BEFORE before
    the anchor, less a word token that an edge cuts."""
    begin = 0 if anchor is None else max(anchor - WINDOW_BEFORE, 0)
    finish = min(begin + WINDOW_CHARS, len(text))
    if words:
        wordish = _WORDISH_CHAR
        if begin > 0 and wordish.match(text, begin - 1) and wordish.match(text, begin):
            begin = _WORDISH_RUN.match(text, begin).end()  # type: ignore[union-attr]
        if finish < len(text) and wordish.match(text, finish - 1) and wordish.match(text, finish):
            tail = _WORDISH_TAIL.search(text, begin, finish)
            finish = tail.start() if tail is not None else begin
    return begin, finish


def exact_is_bounded(
    text: str, phrases: Sequence[Phrase] | Sequence[str], *, trigram: bool = False
) -> bool:
    """Whether FTS5's own snippet of ``text`` for these phrases (word phrases, or a
    trigram query's quoted tokens) stays bounded: at most EXACT_INSTANCES instances."""
    return not _Finder(text, phrases, trigram).more_than(EXACT_INSTANCES)


def bounded_word_snippet(
    text: str,
    phrases: Sequence[Phrase],
    *,
    near: Sequence[Near] = (),
    groups: Sequence[Group] | None = None,
    tokens: int = 40,
    start: str = ">>>",
    end: str = "<<<",
    ellipsis: str = "...",
) -> str:
    """A snippet of bounded cost for any text: FTS5's snippet of a window of it.

    The window is WINDOW_CHARS characters of ``text`` from WINDOW_BEFORE before the first
    instance of a marked phrase (every phrase, or with ``groups`` those of the groups'
    operands; without any instance, from the start), less a token an edge cuts. It is
    snippeted as if it were the whole text, each marked phrase marked wherever it occurs
    in it (NEAR groups trimmed within it), with ``ellipsis`` where it cuts the text.
    """
    marked = _marked(len(phrases), groups)
    begin, finish = _window(text, _Finder(text, phrases, False).first(marked), words=True)
    window = text[begin:finish]
    doc, lists, sizes, _partial = _word_instances(window, phrases, near)
    lists = [positions if i in marked else [] for i, positions in enumerate(lists)]
    cut = (begin > 0, finish < len(text))
    return _snippet(window, doc, lists, sizes, tokens, (start, end, ellipsis), cut)


def bounded_trigram_snippet(
    text: str,
    substrings: Sequence[str],
    *,
    groups: Sequence[Group] | None = None,
    tokens: int = 40,
    start: str = ">>>",
    end: str = "<<<",
    ellipsis: str = "...",
) -> str:
    """:func:`bounded_word_snippet` for a trigram query (a window of characters: every
    trigram in it is whole)."""
    marked = _marked(len(substrings), groups)
    begin, finish = _window(text, _Finder(text, substrings, True).first(marked), words=False)
    window = text[begin:finish]
    doc = _trigram_tokens(window)
    grams = [token.text for token in doc]
    lists = [
        _positions(grams, [(token.text, False) for token in _trigram_tokens(sub)])
        if i in marked
        else []
        for i, sub in enumerate(substrings)
    ]
    sizes = [len(_trigram_tokens(sub)) for sub in substrings]
    cut = (begin > 0, finish < len(text))
    return _snippet(window, doc, lists, sizes, tokens, (start, end, ellipsis), cut)
