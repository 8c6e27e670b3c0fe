"""The docs site builds as CI builds it (`mkdocs build --strict`), and the strict build is what catches a broken
link: the same site with one link pointing nowhere fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root, capture_output=True, text=True, timeout=240, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


def test_the_docs_build_strict_and_every_page_is_in_the_nav(tmp_path):
    r = build(ROOT, tmp_path / "site")
    assert r.returncode == 0, r.stderr
    assert 'not included in the "nav"' not in r.stderr, r.stderr
    quick = (tmp_path / "site" / "quickstart" / "index.html").read_text()
    assert "Start the platform" in quick and "job.yaml" in quick
    assert (tmp_path / "site" / "zh" / "quickstart" / "index.html").exists()  # the zh site, English where untranslated
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()
    assert "for the record" in changelog  # CHANGELOG.md itself, included


def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy)
    shutil.copy(ROOT / "CHANGELOG.md", copy)
    shutil.copytree(ROOT / "docs", copy / "docs")
    page = copy / "docs" / "jobs.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    r = build(copy, tmp_path / "site")
    assert r.returncode != 0 and "no-such-page.md" in r.stderr, r.stderr


def test_every_link_of_the_readme_and_changelog_reaches_a_file():
    """README.md and CHANGELOG.md are outside the site, so the strict build does not see their links."""
    for name in ("README.md", "CHANGELOG.md"):
        links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / name).read_text())
        local = [link for link in links if "://" not in link]
        missing = [link for link in local if not (ROOT / link).exists()]
        assert not missing, (name, missing)
    assert "docs/quickstart.md" in (ROOT / "README.md").read_text()
