"""The docs site's build hooks (mkdocs.yml ``hooks``), and the generator of the configuration reference.

- The README and CONTRIBUTING.md live at the repository's root, where GitHub shows them; the site shows them
  too, as its home page and its contributing page. Their links, and links to them from the pages in docs/, are
  written for GitHub (``docs/api.md``, ``../README.md``) and rewritten here for the site.
- docs/configuration.md's table of settings is generated from ``Settings``' own field descriptions.
  ``python docs/hooks.py`` rewrites it; a build whose page differs from what ``Settings`` says warns, so
  ``mkdocs build --strict`` (``make docs``, tests/e2e/test_docs_site.py) fails until it is regenerated.
"""

from __future__ import annotations

import logging
import posixpath
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
BEGIN = "<!-- settings: generated from shared/settings.py by `python docs/hooks.py`; edit the descriptions there -->"
END = "<!-- end of settings -->"
# Repository files outside docs/ that are pages of the site, and the page each one is.
ROOT_PAGES = {"README.md": "index.md", "CONTRIBUTING.md": "contributing.md"}
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}

log = logging.getLogger("mkdocs.hooks.inferq")


def settings_table() -> str:
    """The settings as a markdown table: variable, type, default and the field's description."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from pydantic import SecretStr
    from pydantic_settings import NoDecode

    from inferq.shared.settings import PREFIX, Settings

    rows = ["| variable | type | default | bounds | meaning |", "|---|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        if not field.description:
            raise ValueError(f"Settings.{name} has no description: docs/configuration.md is generated from it")
        comma = any(isinstance(meta, NoDecode) or meta is NoDecode for meta in field.metadata)
        kind = "secret string" if _unwrap(field.annotation) is SecretStr else _type(field.annotation, comma)
        default = field.get_default(call_default_factory=True)
        cells = (f"`{PREFIX}{name.upper()}`", kind, _default(default), _bounds(field.metadata), field.description)
        rows.append("| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |")
    return "\n".join(rows)


def _unwrap(annotation: Any) -> Any:
    """The type inside ``X | None``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return inner[0] if len(inner) == 1 else annotation
    return annotation


def _type(annotation: Any, comma: bool) -> str:
    annotation = _unwrap(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0], comma)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{arg}`" for arg in args)
    if origin is list:
        return ("comma-separated " if comma else "JSON list of ") + _type(args[0], False) + "s"
    if origin is dict:
        return "comma-separated `name=value` pairs" if comma else "JSON object"
    if origin in (typing.Union, types.UnionType):  # a number or a word: `INFERQ_CPU_THREADS`
        return " or ".join(_type(arg, comma) for arg in args)
    return TYPES[annotation]


def _bounds(metadata: list[Any]) -> str:
    """The field's numeric constraints (``ge``, ``gt``, ``le``, ``lt``), as checked at start."""
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    found = []
    for meta in metadata:
        for name, sign in signs.items():
            value = getattr(meta, name, None)
            if isinstance(value, int | float):
                found.append(f"{sign} {_number(value)}")
    return ", ".join(found)


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _default(value: Any) -> str:
    if value is None or value == [] or value == {}:
        return "unset"
    if isinstance(value, list):
        return "`[" + ", ".join(_number(item) for item in value) + "]`"
    if isinstance(value, float):
        return f"`{_number(value)}`"
    return f"`{value}`"


def with_table(page: str, table: str) -> str:
    """``page`` with the text between its two settings markers replaced by ``table``."""
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return f"{page[:start]}\n\n{table}\n\n{page[end:]}"


def site_links(markdown: str, source: str, page: str) -> str:
    """Relative links of ``source`` (a repository path) as they resolve from ``page`` (a path in docs/)."""

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", target):
            return match.group(0)  # a URL, an anchor on this page, or an absolute path: the build judges it
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        if resolved in ROOT_PAGES:
            resolved = f"docs/{ROOT_PAGES[resolved]}"
        if not resolved.startswith("docs/"):
            return match.group(0)  # outside the site: left for the build to warn about
        new = posixpath.relpath(resolved, posixpath.dirname(f"docs/{page}"))
        return f"{match.group(1)}{new}{'#' + anchor if anchor else ''}{match.group(3)}"

    return LINK.sub(rewrite, markdown)


def on_files(files: Any, config: Any) -> Any:
    """The README and CONTRIBUTING.md join the site's files as its home and contributing pages."""
    from mkdocs.structure.files import File

    for name, page in ROOT_PAGES.items():
        files.append(File.generated(config, page, content=(ROOT / name).read_text(encoding="utf-8")))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src = page.file.src_uri
    source = next((name for name, dest in ROOT_PAGES.items() if dest == src), f"docs/{src}")
    if src == "configuration.md" and with_table(markdown, settings_table()) != markdown:
        log.warning("docs/configuration.md's settings table is not what shared/settings.py says: python docs/hooks.py")
    return site_links(markdown, source, src)


if __name__ == "__main__":
    CONFIGURATION.write_text(with_table(CONFIGURATION.read_text(encoding="utf-8"), settings_table()), encoding="utf-8")
