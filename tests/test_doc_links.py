"""The README's and docs' links: every relative link names a file of the repository, and every #anchor a heading
(GitHub's slug of it) or an explicit <a id> in the file it points to, so a renamed heading cannot leave a dead link."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "benchmarks").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # a '#' comment in a code block is no heading
    found, seen = set(), {}
    for line in text.splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(re.sub(r"<a id=\"[^\"]+\"></a>", "", m.group(1)))
            n = seen.get(base, 0)  # GitHub numbers a repeated heading's anchor: x, x-1, x-2
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found | set(re.findall(r"<a id=\"([^\"]+)\"", text))


def links(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if not re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not checked here
            yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_local_link_and_anchor_exists(page):
    dead = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            dead.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            dead.append(target)
    assert not dead, f"{page.relative_to(REPO)}: dead links {dead}"


def test_the_slug_is_githubs():
    assert slug("Framework profiles (`planner/profiles/`, by name in `planner/frameworks.py`, `--framework`)") == \
        "framework-profiles-plannerprofiles-by-name-in-plannerframeworkspy---framework"
    assert slug("torchao's float8 all-gather for FSDP, modelled (2026-12-04, ninth session)") == \
        "torchaos-float8-all-gather-for-fsdp-modelled-2026-12-04-ninth-session"
