"""The generated command reference (docs/commands.md) and the links of the docs.

docs/commands.md must be exactly what scripts/commands_doc.py writes from the
command table now; every documented form must be one the parser accepts; and
every relative link and anchor in README.md and docs/*.md must resolve.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from repl.commands import COMMANDS, CommandError
from repl.settings import PROCESSOR_ARGS, Settings
from utils.options import GAMMA_RANGE, NGRAM_STORAGES
from scripts import commands_doc

REPO = Path(__file__).resolve().parents[1]


def _changed(name: str, **fields) -> dict:
    """A copy of COMMANDS with one entry changed."""
    return {**COMMANDS, name: dataclasses.replace(COMMANDS[name], **fields)}


# ------------------------------------------------------------- the page is current

def test_the_page_is_what_the_table_gives_now():
    assert (REPO / "docs" / "commands.md").read_text(encoding="utf-8") == commands_doc.render(), \
        "docs/commands.md is stale: run python scripts/commands_doc.py"


def test_check_exits_1_with_one_line_when_stale(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "commands.md"
    monkeypatch.setattr(commands_doc, "DOC", doc)
    assert commands_doc.main(["--check"]) == 1  # missing
    doc.write_text(commands_doc.render().replace("/gamma N", "/gamma M"), encoding="utf-8")
    assert commands_doc.main(["--check"]) == 1  # one word off
    err = capsys.readouterr().err.splitlines()
    assert err == ["docs/commands.md is stale: run python scripts/commands_doc.py"] * 2
    assert commands_doc.main([]) == 0 and commands_doc.main(["--check"]) == 0
    assert doc.read_text(encoding="utf-8") == commands_doc.render()


def test_every_command_appears_with_its_grammar_flag_help_and_default():
    page = commands_doc.render()
    defaults = Settings()
    for command in COMMANDS.values():
        section = page.split(f"### `/{command.name}`\n", 1)[1].split("\n### ", 1)[0]
        assert f"```text\n{command.usage}\n" in section, command.name
        if command.flag:
            assert f"\n{command.flag_usage}\n```" in section, command.name
        assert command.help[1:] in section, command.name
        if command.show is not None:
            assert f"Default: `{command.show(defaults)}`." in section, command.name


def test_the_reference_offers_every_storage_kind_the_parser_accepts():
    page = commands_doc.render()
    assert "/set_ngramstorage basic|onelevel|recycling N" in page
    assert set(commands_doc.choices(COMMANDS["set_ngramstorage"])) == set(NGRAM_STORAGES)
    assert commands_doc.choices(COMMANDS["processor"]) == list(PROCESSOR_ARGS)


def test_ranges_are_the_parsers_own():
    assert commands_doc.bounds(COMMANDS["gamma"]) == GAMMA_RANGE
    page = commands_doc.render()
    assert f"`N`, a whole number from {GAMMA_RANGE[0]} to {GAMMA_RANGE[1]}." in page
    for command in COMMANDS.values():
        if commands_doc.bounds(command) is None:
            continue
        lo, hi = commands_doc.bounds(command)
        command.parse([commands_doc.number(lo)], Settings())
        command.parse([commands_doc.number(hi)], Settings())
        for outside in (lo - 1, hi + 1):
            with pytest.raises(CommandError):
                command.parse([commands_doc.number(outside)], Settings())


# ------------------------------------------- a changed or drifting table is caught

def test_the_table_as_it_is_agrees_with_its_parsers():
    assert [p for c in COMMANDS.values() for p in commands_doc.grammar_problems(c)] == []


def test_a_changed_table_changes_the_page():
    page = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    assert commands_doc.render(_changed("gamma", help="drafts per round")) != page
    assert commands_doc.render(_changed("seed", flag="random-seed")) != page
    without_quit = {k: v for k, v in COMMANDS.items() if k != "quit"}
    assert commands_doc.render(without_quit) != page


@pytest.mark.parametrize("name, args", [
    ("set_ngramstorage", "basic|onelevel N"),         # the old usage: leaves out recycling
    ("set_ngramstorage", "basic|onelevel|tree N"),    # offers a kind the parser refuses
    ("set_ngramstorage", "basic|onelevel|recycling"),  # leaves out N
    ("processor", "greedy [T] | multinomial T | topk T | nucleus T P | topknucleus T K P"),
    ("gamma_policy", "constant | heuristic | confidence | model"),
    ("uag", "slem"),
])
def test_a_usage_that_drifts_from_its_parser_is_refused(name, args):
    commands = _changed(name, args=args)
    assert commands_doc.grammar_problems(commands[name])
    with pytest.raises(ValueError, match=f"/{name}"):
        commands_doc.render(commands)


def test_bounds_that_are_not_the_parsers_are_refused():
    parse = COMMANDS["gamma"].parse

    def claims_less(words, settings):
        return parse(words, settings)

    claims_less.bounds = (1, 64)  # the parser really accepts up to 128
    assert commands_doc.grammar_problems(dataclasses.replace(COMMANDS["gamma"], parse=claims_less))


# ------------------------------------------------------------- links in the docs

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: no markup, lower case, no punctuation but
    - and _, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        found.update(HTML_ANCHOR.findall(line))
        if m := HEADING.match(line):
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(path: Path) -> list[str]:
    """Each relative link of ``path`` whose file or anchor does not exist."""
    broken = []
    for number, line in enumerate(_prose_lines(path.read_text(encoding="utf-8")), 1):
        for target in LINK.findall(re.sub(r"`[^`]*`", lambda m: _link_text_only(m.group()), line)):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.name}: {target} (no such anchor)")
    return broken


def _link_text_only(code: str) -> str:
    """Inline code may sit inside a link's text ([`/gamma`](#gamma)) but its own
    brackets and parentheses are not links: blank them."""
    return re.sub(r"[\[\]()]", " ", code)


def _docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_every_relative_link_and_anchor_resolves():
    assert [b for path in _docs() for b in broken_links(path)] == []


def test_the_link_check_finds_a_broken_file_or_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## The network what-if (`/rtt` and `--rtt-inject`)\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#the-network-what-if-rtt-and---rtt-inject) [ok](#page)\n"
                    "[no file](missing.md) [no anchor](other.md#the-network) [`/x`](#nowhere)\n"
                    "```text\n[in code](ignored.md)\n```\n`[code](ignored.md)` [web](https://x.org/a.md)\n")
    assert broken_links(page) == ["page.md: missing.md (no such file)",
                                  "page.md: other.md#the-network (no such anchor)",
                                  "page.md: #nowhere (no such anchor)"]


def test_slugs_follow_github():
    assert slug("The network what-if (`/rtt` and `--rtt-inject`)") == "the-network-what-if-rtt-and---rtt-inject"
    assert slug("`/set_ngramstorage`") == "set_ngramstorage"
    assert slug("A lean draft step (2026-11-24)") == "a-lean-draft-step-2026-11-24"


# ------------------------------------------------------------- the README stays short

README_WORDS = 900      # words outside fenced code blocks; detail goes to docs/


def prose_words(text: str) -> int:
    """Words outside ``` fenced blocks."""
    inside, count = False, 0
    for line in text.splitlines():
        if line.strip().startswith("```"):
            inside = not inside
        elif not inside:
            count += len(line.split())
    return count


def test_the_readme_stays_within_its_word_budget():
    assert prose_words((REPO / "README.md").read_text(encoding="utf-8")) <= README_WORDS


def test_the_word_count_leaves_code_blocks_out():
    # Mutation check: a count that read the fenced block too would say 6.
    assert prose_words("one two\n```bash\nthree four\n```\nfive six\n") == 4
