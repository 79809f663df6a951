"""Text that someone else may have written, as tenure stores or shows it: one cleaner.

A stored error, a task name another client wrote, a consent's tool name: whatever tenure
writes into an error column or shows on a terminal, a log line or a console page passes
through :func:`clean_text` first, so that no stored text can move a terminal's cursor,
recolour it, hide what follows, or reorder what a reader sees:

- control characters (C0 except tab and the line breaks, DEL, C1, NEL included) become
  U+FFFD;
- bidirectional embeddings, overrides and isolates (U+202A to U+202E, U+2066 to U+2069:
  the characters of the "Trojan Source" attack, as Rust's ``text_direction_codepoint``
  lints name them) become U+FFFD. The marks (U+200E, U+200F, U+061C) stay: each sets the
  direction of one neutral character and cannot reorder a span;
- the line breaks are made plain: a carriage return (alone, or before a line feed), the
  line separator U+2028 and the paragraph separator U+2029 become a line feed, so a
  terminal never returns to a line's start to write over it and every reader sees the
  same lines;
- what UTF-8 cannot encode (a lone surrogate) becomes ``?``.

Two policies, one per use: a text that may span lines (a stored error, a page's error
block) keeps its tabs and line feeds; a one-line display (``one_line=True``: a table cell,
a refusal's detail) turns every run of white space, line breaks and tabs included, into
one space. Either way the result is cut to ``max_bytes`` UTF-8 bytes on a character
boundary, marked with an ellipsis (U+2026) when anything was cut.
"""

from __future__ import annotations

from typing import overload

__all__ = ["MAX_TEXT_BYTES", "REPLACEMENT", "NEUTRALISED", "clean_text"]

MAX_TEXT_BYTES = 2048
"""The most UTF-8 bytes of one text :func:`clean_text` keeps unless told otherwise: what a
stored error holds at most (``tenure.adapters.core.failure_text.MAX_ERROR_BYTES``), so a
display shows a stored error whole."""

REPLACEMENT = "\ufffd"
"""What a neutralised character becomes."""

ELLIPSIS = "\u2026"

_CONTROLS = (*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0))
"""C0 but tab, line feed and carriage return; DEL; C1 (NEL, U+0085, among them)."""

_BIDIRECTIONAL = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
"""LRE, RLE, PDF, LRO, RLO; LRI, RLI, FSI, PDI."""

_LINE_BREAKS = (0x0D, 0x2028, 0x2029)
"""Carriage return, line separator, paragraph separator: each becomes a line feed."""

NEUTRALISED = frozenset(map(chr, (*_CONTROLS, *_BIDIRECTIONAL)))
"""Every character :func:`clean_text` replaces with :data:`REPLACEMENT`."""

_KEEP_LINES = {code: REPLACEMENT for code in (*_CONTROLS, *_BIDIRECTIONAL)} | dict.fromkeys(_LINE_BREAKS, "\n")
_ONE_LINE = _KEEP_LINES | dict.fromkeys((0x09, 0x0A, *_LINE_BREAKS), " ")


@overload
def clean_text(text: str, max_bytes: int = ..., *, one_line: bool = ...) -> str: ...


@overload
def clean_text(text: None, max_bytes: int = ..., *, one_line: bool = ...) -> None: ...


def clean_text(text: str | None, max_bytes: int = MAX_TEXT_BYTES, *, one_line: bool = False) -> str | None:
    """``text`` as it may be stored or shown (see the module docstring), cut to
    ``max_bytes`` UTF-8 bytes; None stays None (a field with no text).

    ``one_line=False`` keeps tabs and line feeds (a carriage return before a line feed
    goes, so a CRLF text keeps its lines once); ``one_line=True`` makes every run of
    white space one space and strips it from both ends."""
    if text is None:
        return None
    # Every character is at least one byte once cleaned, so what lies past the first
    # max_bytes + 1 characters is cut anyway (white space runs collapse: the ellipsis
    # still says so): never clean megabytes to keep two KiB.
    window = text[: max_bytes + 1]
    if one_line:
        cleaned = " ".join(window.translate(_ONE_LINE).split())
    else:
        cleaned = window.replace("\r\n", "\n").translate(_KEEP_LINES)
    encoded = cleaned.encode("utf-8", "replace")
    if len(encoded) <= max_bytes and len(window) == len(text):
        return encoded.decode("utf-8")
    marker = ELLIPSIS.encode()
    return encoded[: max(0, max_bytes - len(marker))].decode("utf-8", "ignore") + ELLIPSIS
