"""MkDocs hook for tenure's documentation site (named in mkdocs.yml; not part of the package).

It does what plain configuration cannot:

- **The ``tenure`` namespace for griffe.** ``tenure`` is an implicit namespace package
  mapped from five folders (``model/`` -> ``tenure.model``, ``kernel/`` ->
  ``tenure.kernel``, ``adapters/`` -> ``tenure.adapters``, ``conformance/`` and ``apps/``
  alike: pyproject's ``package-dir``).
  No folder named ``tenure`` exists in a clone, and an installed copy depends on how it
  was installed (a strict editable install links files under ``build/``, a plain one
  leaves an import hook griffe does not follow). So before mkdocstrings starts, this
  hook lays out a ``tenure/`` folder of symbolic links in a temporary folder, one link
  per top-level mapping read from pyproject.toml, and makes that folder the Python
  handler's search path. The API pages document the source tree itself, installed or
  not, and a package added to the mapping is found without touching the site.
- **Pages that live outside ``docs/``.** README.md (served as "Getting started"), the
  spec tables ``specs/*.md`` and ``bench/RESULTS.md`` with its chart stay where tests and
  reviewers read them; the site serves them too, so their links are checked by the
  strict build like any page's.
- **One spelling of every link.** Every page links as the files lie in the repository
  (``docs/tasks.md`` from the README, ``../specs/runs.md`` from a docs page), so links
  also work when the Markdown is read in place. Before a page is rendered its relative
  links are rewritten to where the target sits in the site; a target the site does not
  serve is left as written, and the strict build then fails on it.
"""

from __future__ import annotations

import atexit
import pathlib
import posixpath
import re
import shutil
import tempfile
import tomllib
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = "docs"

OUTSIDE_PAGES = {"README.md": "getting-started.md"}
"""Files outside ``docs/`` served under another site path: repository path -> site path."""

OUTSIDE_GLOBS = ("specs/*.md", "bench/RESULTS.md", "bench/results.png")
"""Files outside ``docs/`` served under their own repository path."""

LINK = re.compile(r"(\]\()([^)\s]+)(\))")
"""An inline Markdown link's target (``[text](target)``)."""

SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)

_search_path: pathlib.Path | None = None


def namespace_folders() -> dict[str, pathlib.Path]:
    """``{"model": ROOT/"model", ...}``: pyproject's top-level ``tenure.X = "folder"`` mappings."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        package_dir = tomllib.load(handle)["tool"]["setuptools"]["package-dir"]
    folders = {}
    for package, folder in package_dir.items():
        parts = package.split(".")
        if len(parts) == 2 and parts[0] == "tenure":
            folders[parts[1]] = ROOT / folder
    assert folders, "pyproject.toml maps no tenure.* package"
    return folders


def namespace_search_path() -> pathlib.Path:
    """A folder holding ``tenure/`` with one link per mapped package (made once per process)."""
    global _search_path
    if _search_path is None:
        base = pathlib.Path(tempfile.mkdtemp(prefix="tenure-docs-"))
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        namespace = base / "tenure"  # no __init__.py: an implicit namespace, as installed
        namespace.mkdir()
        for name, folder in namespace_folders().items():
            (namespace / name).symlink_to(folder, target_is_directory=True)
        _search_path = base
    return _search_path


def outside_files() -> dict[str, str]:
    """Repository path -> site path, for every served file that lives outside ``docs/``."""
    served = dict(OUTSIDE_PAGES)
    for pattern in OUTSIDE_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            relative = path.relative_to(ROOT).as_posix()
            served[relative] = relative
    return served


def site_path(repository_path: str) -> str | None:
    """Where a repository file sits in the site, or None when the site does not serve it."""
    if repository_path.startswith(DOCS + "/"):
        return repository_path.removeprefix(DOCS + "/")
    return outside_files().get(repository_path)


def repository_path(page_src_uri: str) -> str:
    """Where the page's Markdown lies in the repository."""
    for repository, site in outside_files().items():
        if site == page_src_uri:
            return repository
    return f"{DOCS}/{page_src_uri}"


def rewrite_link(target: str, page_repository: str, page_site: str) -> str:
    """A link written from the page's place in the repository, pointed at the site's file."""
    if SCHEME.match(target) or target.startswith(("#", "/")):
        return target
    path, hash_mark, anchor = target.partition("#")
    linked = posixpath.normpath(posixpath.join(posixpath.dirname(page_repository), path))
    in_site = site_path(linked)
    if in_site is None:
        return target  # not served: left for the strict build to report
    relative = posixpath.relpath(in_site, posixpath.dirname(page_site) or ".")
    return relative + hash_mark + anchor


@event_priority(100)  # before mkdocstrings reads its handler configuration
def on_config(config: MkDocsConfig) -> MkDocsConfig:
    handlers: dict[str, Any] = config.plugins["mkdocstrings"].config.handlers
    handlers.setdefault("python", {})["paths"] = [str(namespace_search_path())]
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for repository, site in outside_files().items():
        files.append(File.generated(config, site, abs_src_path=str(ROOT / repository)))
    return files


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    page_site = page.file.src_uri
    page_repository = repository_path(page_site)
    lines, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            line = LINK.sub(
                lambda match: match[1] + rewrite_link(match[2], page_repository, page_site) + match[3], line
            )
        lines.append(line)
    return "".join(lines)
