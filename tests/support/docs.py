"""The documents' examples as tests read them: fenced blocks, and each bash command in one with the answer shown
below it (tests/e2e/test_readme_examples.py runs them against a stack; tests/e2e/test_e2e_up.py runs the README's
rollout walk-through under `inferq up`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

# A fenced block after this comment is a walk-through that one test runs in order under `inferq up`, whose name the
# comment gives: <!-- walk-through: tests/e2e/test_e2e_up.py -->.
WALK_THROUGH = re.compile(r"<!-- walk-through: (\S+) -->")


@dataclass(frozen=True)
class Example:
    """One bash command (its continuation lines joined) or one python snippet of a document."""

    source: str  # the document, relative to the repository's root
    line: int
    kind: str
    code: str
    # The comment lines after it that show its answer, and its own trailing comment.
    shown: tuple[str, ...] = ()
    note: str = ""
    # The test that runs it as a step of a walk-through (WALK_THROUGH), if it is one.
    walk_through: str = ""

    @property
    def id(self) -> str:
        first = self.code.splitlines()[0]
        document = re.sub(r"[^A-Za-z0-9]+", "-", self.source.removeprefix("docs/").removesuffix(".md"))
        return f"{document}-line{self.line}-{re.sub(r'[^A-Za-z0-9]+', '-', first)[:40].strip('-')}"

    @property
    def where(self) -> str:
        return f"{self.source} line {self.line}"


def blocks(text: str) -> Iterator[tuple[str, int, list[str], str]]:
    """(language, line of the first code line, lines, the test that runs it as a walk-through or "") of each fenced
    block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            language, start = lines[i][3:].strip(), i + 2
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = next((line for line in reversed(lines[:i]) if line.strip()), "")
            marked = WALK_THROUGH.search(before)
            yield language, start, lines[i + 1 : end], marked.group(1) if marked else ""
            i = end
        i += 1


def bash_commands(source: str, start: int, lines: list[str], walk_through: str = "") -> Iterator[Example]:
    i = 0
    while i < len(lines):
        if not lines[i].strip() or lines[i].lstrip().startswith("#"):
            i += 1
            continue
        first, parts = i, [lines[i]]
        # Continued with a backslash, or (the CLI's synopsis) wrapped onto an indented line.
        while parts[-1].endswith("\\") or (i + 1 < len(lines) and lines[i + 1].startswith(" ")):
            i += 1
            parts.append(lines[i])
        heredoc = re.search(r"<<'?(\w+)'?", parts[0])
        if heredoc:
            while lines[i].strip() != heredoc.group(1):
                i += 1
                parts.append(lines[i])
        i += 1
        shown = []
        while i < len(lines) and lines[i].lstrip().startswith("#"):
            shown.append(lines[i].lstrip()[1:].strip())
            i += 1
        last, note = parts[-1], ""
        comment = re.search(r"\s+#\s.*$", last) if not heredoc else None
        if comment:
            parts[-1], note = last[: comment.start()], comment.group().strip()[1:].strip()
        yield Example(source, start + first, "bash", "\n".join(parts), tuple(shown), note, walk_through)


def walk_through(text: str, source: str, test: str) -> list[Example]:
    """The commands of ``source``'s walk-through that ``test`` runs, in order."""
    found = [
        example
        for language, start, lines, marked in blocks(text)
        if language == "bash" and marked == test
        for example in bash_commands(source, start, lines, marked)
    ]
    assert found, f"{source} has no walk-through for {test}"
    return found
