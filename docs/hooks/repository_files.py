"""An mkdocs hook: repository files that the pages link to are part of the site.

A page links a file outside ``docs/`` the way it is reached in the repository
(``[RESULTS.md](../benchmarks/RESULTS.md)``), so the link also works when the
Markdown is read on a git host or in an editor. Here every such file (and any
file such a Markdown file links to in turn, e.g. a benchmark report's chart) is
added to the build: Markdown is rendered as a page outside the navigation, any
other file is copied as it is. The links are rewritten to point at those
copies, and ``mkdocs build --strict`` still fails on a link to a file that
does not exist.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

# ](target) or ](target#anchor) of a Markdown link or image, not inside code spans
LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
PREFIX = "repository/"  # where the repository's files land in the site


def _repo_root(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _outside_targets(md_text: str, src_uri: str, docs: Path, root: Path) -> set[str]:
    """Repository-relative paths of the files outside docs/ that a page links to."""
    found = set()
    for m in LINK.finditer(md_text):
        target = m.group("target")
        if "://" in target or target.startswith(("/", "mailto:")):
            continue
        path = (docs / posixpath.dirname(src_uri) / target).resolve()
        if docs in path.parents or path == docs:
            continue
        if root in path.parents:
            found.add(path.relative_to(root).as_posix())
    return found


def on_files(files: Files, config) -> Files:
    root, docs = _repo_root(config), Path(config["docs_dir"]).resolve()
    todo = []
    for f in files.documentation_pages():
        todo += _outside_targets(Path(f.abs_src_path).read_text(encoding="utf-8"), f.src_uri, docs, root)
    seen: set[str] = set()
    while todo:
        rel = todo.pop()
        if rel in seen or not (root / rel).is_file():
            continue  # a missing file stays a broken link: the strict build reports it
        seen.add(rel)
        files.append(File.generated(config, PREFIX + rel, abs_src_path=str(root / rel),
                                    inclusion=InclusionLevel.NOT_IN_NAV))
        if rel.endswith(".md"):  # a report's own links (a chart beside it)
            text = (root / rel).read_text(encoding="utf-8")
            for m in LINK.finditer(text):
                target = m.group("target")
                if "://" not in target and not target.startswith(("/", "mailto:")):
                    todo.append(posixpath.normpath(posixpath.join(posixpath.dirname(rel), target)))
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    root, docs = _repo_root(config), Path(config["docs_dir"]).resolve()
    src_uri = page.file.src_uri
    if src_uri.startswith(PREFIX):
        return markdown  # a repository file: its links are relative to itself already
    here = posixpath.dirname(src_uri)

    def rewrite(m: re.Match[str]) -> str:
        target = m.group("target")
        if "://" in target or target.startswith(("/", "mailto:")):
            return m.group(0)
        path = (docs / here / target).resolve()
        if docs in path.parents or path == docs or root not in path.parents:
            return m.group(0)
        copy = PREFIX + path.relative_to(root).as_posix()
        return f"]({posixpath.relpath(copy, here or '.')}{m.group('anchor') or ''})"

    return LINK.sub(rewrite, markdown)
