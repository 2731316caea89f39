"""The documentation cannot rot: every ```python block under ``docs/`` runs, and printed output
that a page shows is the output the code prints today.

Conventions (HTML comments, invisible on the rendered site):

* each page's ```python blocks run in order in one namespace (a page is one test);
* ``<!-- skip: <reason> -->`` on the line before a block leaves it out — only for code that needs a
  GPU (a launch, a timing); the reason is required;
* ``<!-- output -->`` on the line before a ```text block makes that block the expected standard
  output of the python block just before it (compared line by line, trailing spaces ignored).

``python tests/test_docs.py --update docs/<page>.md ...`` rewrites a page's ``<!-- output -->``
blocks with what its code prints now (read the diff before committing it).

A failing block reports its page and line: the code is compiled under the page's file name, with
its line numbers.  ``test_mkdocs_build_is_strict_clean`` builds the site with ``mkdocs build
--strict`` (broken links, missing pages, docstrings the reference cannot render).
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)\s*$")
_SKIP = re.compile(r"^<!--\s*skip:\s*(?P<reason>\S.*?)\s*-->$")
_OUTPUT = re.compile(r"^<!--\s*output\s*-->$")


@attrs.frozen
class Block:
    page: Path
    line: int               # 1-based line of the first line of code
    lang: str
    code: str
    skip: str | None = None  # the reason, for a skipped block
    output: bool = False     # a text block that is the previous python block's expected output


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page``, with the markers of the line before each."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i].strip())
        if not m:
            i += 1
            continue
        fence, lang = m["fence"], m["lang"]
        indent = len(lines[i]) - len(lines[i].lstrip())
        prev = next((p.strip() for p in reversed(lines[:i]) if p.strip()), "")
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        if j == len(lines):
            raise AssertionError(f"{_name(page)}:{i + 1}: a code block that is never closed")
        code = "\n".join(ln[indent:] for ln in lines[i + 1:j])
        sk = _SKIP.match(prev)
        out.append(Block(page, i + 2, lang, code, sk["reason"] if sk else None, bool(_OUTPUT.match(prev))))
        i = j + 1
    return out


def _name(page: Path) -> str:
    """``page`` as messages and tracebacks name it: relative to the repository where it is in it."""
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _normalise(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _run_page(page: Path) -> int:
    """Run ``page``'s python blocks in one namespace; check the outputs it shows.  Returns how
    many blocks ran."""
    ns: dict = {"__name__": f"docs.{page.stem}"}
    last_stdout: str | None = None
    ran = 0
    rel = _name(page)
    for b in blocks(page):
        where = f"{rel}:{b.line}"
        if b.output:
            assert b.lang in ("", "text"), f"{where}: an <!-- output --> block is a ```text block"
            assert last_stdout is not None, f"{where}: an <!-- output --> block follows no python block that ran"
            want, got = _normalise(b.code), _normalise(last_stdout)
            assert got == want, (f"{where}: the page shows output the code above no longer prints.\n"
                                 "--- the page\n" + "\n".join(want) + "\n--- printed now\n" + "\n".join(got))
            last_stdout = None
            continue
        if b.lang not in ("python", "py"):
            continue
        if b.skip is not None:
            last_stdout = None
            continue
        code = compile("\n" * (b.line - 1) + b.code, rel, "exec")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(code, ns)
        last_stdout = buf.getvalue()
        ran += 1
    return ran


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_page_code_runs_and_shows_what_it_prints(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run_page(page)


def test_skipped_blocks_are_rare_and_say_why():
    skipped = [b for p in pages() for b in blocks(p) if b.skip is not None]
    for b in skipped:
        assert "GPU" in b.skip, f"{b.page.relative_to(ROOT)}:{b.line}: skip only what needs a GPU (say so)"
    runnable = [b for p in pages() for b in blocks(p) if b.lang in ("python", "py") and b.skip is None]
    assert len(skipped) * 5 <= len(runnable), "most documented code must run"


def test_the_block_parser_reads_markers(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("text\n\n<!-- skip: needs a GPU -->\n```python\nx = 1\n```\n\n```python\nprint(2)\n```\n"
                    "<!-- output -->\n```text\n2\n```\n")
    assert [(b.lang, b.skip, b.output, b.line) for b in blocks(page)] == [
        ("python", "needs a GPU", False, 5), ("python", None, False, 9), ("text", None, True, 13)]
    assert _run_page(page) == 1


def test_a_stale_output_block_fails(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```python\nprint('now')\n```\n<!-- output -->\n```text\nthen\n```\n")
    with pytest.raises(AssertionError, match="no longer prints"):
        _run_page(page)


def test_a_failing_block_names_its_page_and_line(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# t\n\n```python\nx = 1\ny = x / 0\n```\n")
    with pytest.raises(ZeroDivisionError) as e:
        _run_page(page)
    assert (e.traceback[-1].path, e.traceback[-1].lineno + 1) == (page, 5)


def test_mkdocs_build_is_strict_clean(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[dev]')")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python] is not installed")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    assert (tmp_path / "site" / "index.html").exists()


def update(page: Path) -> bool:
    """Rewrite the ``<!-- output -->`` blocks of ``page`` with what its code prints now; True if
    the page changed."""
    lines = page.read_text().splitlines()
    ns: dict = {"__name__": f"docs.{page.stem}"}
    last: str | None = None
    edits = []                          # (first code line index, end index, new lines)
    for b in blocks(page):
        if b.output:
            if last is not None:
                n = len(b.code.splitlines()) if b.code else 0
                edits.append((b.line - 1, b.line - 1 + n, _normalise(last)))
            last = None
        elif b.lang in ("python", "py") and b.skip is None:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                exec(compile("\n" * (b.line - 1) + b.code, _name(page), "exec"), ns)
            last = buf.getvalue()
        elif b.lang in ("python", "py"):
            last = None
    for start, end, new in reversed(edits):
        lines[start:end] = new
    text = "\n".join(lines) + "\n"
    changed = text != page.read_text()
    page.write_text(text)
    return changed


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "--update" or len(args) < 2:
        sys.exit("usage: python tests/test_docs.py --update docs/<page>.md ...")
    for a in args[1:]:
        print(("updated " if update(Path(a).resolve()) else "unchanged ") + a)
