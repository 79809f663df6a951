"""Reading the console's pages in tests: elements by their ``data-testid``, and the CSRF
token a page's forms carry (the standard library's HTML parser; no browser)."""

from __future__ import annotations

import html.parser
import re
from typing import Any

__all__ = ["by_testid", "texts", "attribute", "csrf_of", "Element"]


class Element:
    def __init__(self, tag: str, attributes: dict[str, str | None]) -> None:
        self.tag = tag
        self.attributes = attributes
        self.text = ""

    def __repr__(self) -> str:
        return f"<{self.tag} {self.attributes} {self.text!r}>"


class _Collector(html.parser.HTMLParser):
    _VOID = {"input", "br", "img", "meta", "link", "hr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[Element] = []
        self.found: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, dict(attrs))
        self.found.append(element)
        if tag not in self._VOID:
            self.open.append(element)

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self.open) - 1, -1, -1):
            if self.open[index].tag == tag:
                del self.open[index:]
                return

    def handle_data(self, data: str) -> None:
        for element in self.open:
            element.text += data


def by_testid(page: str, testid: str) -> list[Element]:
    collector = _Collector()
    collector.feed(page)
    return [element for element in collector.found if element.attributes.get("data-testid") == testid]


def texts(page: str, testid: str) -> list[str]:
    """The text of each element marked ``testid`` (white space collapsed)."""
    return [" ".join(element.text.split()) for element in by_testid(page, testid)]


def attribute(page: str, testid: str, name: str) -> list[Any]:
    return [element.attributes.get(name) for element in by_testid(page, testid)]


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page)
    assert found is not None, "the page carries no form"
    return found.group(1)
