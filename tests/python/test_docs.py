"""Every command the README and docs/ show is one the suite runs, and names what exists;
every link between the pages leads somewhere.

Each ```bash block must follow a comment saying how it is tested:

* `<!-- doc-test: FILE[, FILE…] -->` — those files of the repository (tests, scripts) run the
  same commands: for each command line, its program and every subcommand and flag appear in
  one of them;
* `<!-- doc-test: not run: REASON -->` — the suite does not run it, for REASON.

Either way every command is checked against what it names: repository paths exist; `cargo`'s
`-p` packages and `--bench` targets exist; `floe`, `floe-catalog` and `floe-maintenance`
accept every subcommand and flag shown (their own `--help`, from the built binaries).
"""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass

import pytest
from conftest import _binary

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OURS = {"floe": "FLOE_BIN", "floe-catalog": "FLOE_CATALOG_BIN", "floe-maintenance": "FLOE_MAINTENANCE_BIN"}
MARK = re.compile(r"<!--\s*doc-test:\s*(.*?)\s*-->")


@dataclass
class Block:
    page: pathlib.Path
    line: int
    spec: str | None
    text: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        lines = page.read_text().split("\n")
        i = 0
        while i < len(lines):
            if lines[i].strip() in ("```bash", "```sh", "```shell"):
                before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
                mark = MARK.search(before)
                end = lines.index("```", i + 1)
                found.append(Block(page, i + 1, mark.group(1) if mark else None, "\n".join(lines[i + 1 : end])))
                i = end
            i += 1
    return found


def commands(text: str) -> list[list[str]]:
    """The block's commands as words: continuation lines joined, comments, environment
    assignments and `&` dropped, `a | b` and `a && b` split, `. "$(cmd)"` read as `cmd`,
    and `cargo run [--release] -p X -- ARGS` read as `X ARGS`."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.split("\n"):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] in (".", "source") and len(words) == 2:
            words = shlex.split(re.sub(r"^\$\((.*)\)$", r"\1", words[1]))
        current: list[str] = []
        for word in words + ["|"]:
            if word in ("|", "&&", "&", ";"):
                while current and re.match(r"^[A-Z_][A-Z0-9_]*=", current[0]):
                    current.pop(0)
                if current:
                    out.append(current)
                current = []
            else:
                current.append(word)
    normalised = []
    for words in out:
        if words[:2] == ["cargo", "run"] and "--" in words and "-p" in words:
            package = words[words.index("-p") + 1]
            words = [package, *words[words.index("--") + 1 :]]
        normalised.append(words)
    return normalised


def required_words(words: list[str]) -> list[str]:
    """What another file must hold to run the same command: the program's name, its
    subcommand (the first bare word after it) and every flag."""
    program = words[0]
    needed = [pathlib.Path(program).name if "/" not in program else program]
    rest = words[1:]
    if rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]):
        needed.append(rest[0])
    needed += [w.split("=")[0] for w in rest if w.startswith("-") and w != "--" and not re.fullmatch(r"-\d+", w)]
    return needed


def workspace_packages() -> dict[str, pathlib.Path]:
    packages = {}
    for manifest in ROOT.glob("**/Cargo.toml"):
        if "target" in manifest.parts or manifest.parent == ROOT:
            continue
        name = tomllib.loads(manifest.read_text()).get("package", {}).get("name")
        if name:
            packages[name] = manifest.parent
    return packages


def help_text(program: str, subcommand: str | None) -> str:
    args = [_binary(program, OURS[program]), *([subcommand] if subcommand else []), "--help"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stderr}"
    return done.stdout


ALL = blocks()


def test_every_block_says_how_it_is_tested():
    untested = [b.where() for b in ALL if b.spec is None]
    assert not untested, f"bash blocks without a <!-- doc-test: … --> comment: {untested}"
    assert len(ALL) >= 15, f"found only {len(ALL)} blocks: is the parser reading the pages?"


@pytest.mark.parametrize("block", ALL, ids=lambda b: b.where())
def test_a_block_runs_in_the_suite_and_names_what_exists(block: Block):
    assert block.spec is not None, f"{block.where()}: no <!-- doc-test: … --> comment"
    packages = workspace_packages()
    runners: list[pathlib.Path] = []
    if not block.spec.startswith("not run:"):
        runners = [ROOT / p.strip() for p in block.spec.split(",")]
        for r in runners:
            assert r.is_file(), f"{block.where()}: doc-test names {r}, which does not exist"
    else:
        assert len(block.spec) > len("not run:") + 10, f"{block.where()}: say why it is not run"
    for words in commands(block.text):
        shown = " ".join(words)
        # What it names exists: repository paths, cargo packages and bench targets.
        for w in words:
            if re.fullmatch(r"(jobs|maintenance|deploy|tests|catalog|crates|docker|docs)/[\w./-]+", w):
                assert (ROOT / w).exists(), f"{block.where()}: `{shown}` names {w}, which does not exist"
        if words[0] == "cargo":
            for flag, what in (("-p", "package"), ("--bench", "bench")):
                for i, w in enumerate(words[:-1]):
                    if w != flag:
                        continue
                    name = words[i + 1]
                    if what == "package":
                        assert name in packages, f"{block.where()}: `{shown}`: no package {name}"
                    else:
                        package = packages[words[words.index("-p") + 1]]
                        manifest = (package / "Cargo.toml").read_text()
                        assert (package / "benches" / f"{name}.rs").exists() or f'name = "{name}"' in manifest, (
                            f"{block.where()}: `{shown}`: no bench {name}"
                        )
        # Our binaries accept every subcommand and flag shown.
        if words[0] in OURS:
            top = help_text(words[0], None)
            sub = words[1] if len(words) > 1 and re.fullmatch(r"[a-z][a-z-]*", words[1]) else None
            if sub and re.search(rf"^\s+{re.escape(sub)}\s", top, re.M) is None:
                sub = None  # a positional argument, not a subcommand
            text = help_text(words[0], sub) if sub else top
            for w in words[1:]:
                if w.startswith("--"):
                    flag = w.split("=")[0]
                    assert re.search(rf"{re.escape(flag)}\b", text), (
                        f"{block.where()}: `{shown}`: {words[0]} {sub or ''} has no {flag}:\n{text}"
                    )
        # The suite runs the same command.
        if runners:
            bodies = [r.read_text() for r in runners]
            for needed in required_words(words):
                assert any(needed in body for body in bodies), (
                    f"{block.where()}: `{shown}`: none of {block.spec} runs it (no {needed!r})"
                )


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_every_link_between_the_pages_leads_somewhere():
    broken = []
    for page in PAGES:
        text = page.read_text()
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and path.suffix == ".md":
                anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}
                if anchor not in anchors:
                    broken.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, f"links to nothing: {broken}"
