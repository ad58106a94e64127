"""MkDocs hook: repository files that pages link to become files of the site.

A page may link to a file outside ``docs/`` by its relative path in the repository
(``../examples/custom_env.py``, ``../benchmarks/results/repro/plot.png``), which is
what a repository browser follows. This hook copies each such file that exists into the
site under ``_repo/`` and rewrites the link to it, so the same Markdown works in both
places and ``mkdocs build --strict`` still fails on a link to a file that does not exist.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

_LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
_PREFIX = "_repo"


def _outside_target(page_uri: str, url: str, root: Path, docs: Path) -> str | None:
    """The repository path a relative link leaves ``docs/`` for, if that file exists."""
    if "://" in url or url.startswith(("/", "mailto:")):
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(page_uri), url))
    if not joined.startswith("../"):
        return None
    target = (docs / joined).resolve()
    try:
        relative = target.relative_to(root)
    except ValueError:
        return None
    return relative.as_posix() if target.is_file() else None


def _roots(config: Any) -> tuple[Path, Path]:
    docs = Path(config["docs_dir"]).resolve()
    return Path(config["config_file_path"]).resolve().parent, docs


def on_files(files: Files, config: Any) -> Files:
    """Add every existing repository file that a page links to."""
    root, docs = _roots(config)
    wanted: set[str] = set()
    for file in files.documentation_pages():
        text = Path(file.abs_src_path).read_text(encoding="utf-8")
        for match in _LINK.finditer(text):
            found = _outside_target(file.src_uri, match.group(2), root, docs)
            if found:
                wanted.add(found)
    for relative in sorted(wanted):
        files.append(
            File.generated(config, f"{_PREFIX}/{relative}", abs_src_path=str(root / relative))
        )
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point links that leave ``docs/`` at the copies ``on_files`` added."""
    root, docs = _roots(config)

    def rewrite(match: re.Match[str]) -> str:
        found = _outside_target(page.file.src_uri, match.group(2), root, docs)
        if not found:
            return match.group(0)
        base = posixpath.dirname(page.file.src_uri) or "."
        new = posixpath.relpath(f"{_PREFIX}/{found}", base)
        return f"{match.group(1)}{new}{match.group(3)}"

    return _LINK.sub(rewrite, markdown)
