"""Write the architecture support table: family x strategy, on this transformers version.

    .venv/bin/python scripts/support_table.py [--families llama,mamba2] [--out docs/architectures.md]

Runs the checks of tests/helpers/arch_zoo.py (the same ones tests/test_architectures.py
asserts) on every family and writes docs/architectures.md: a fixed introduction,
then one table per transformers version. Running it under another Python (say
the transformers 4.57 floor environment) adds or replaces that version's table
and keeps the others.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import transformers  # noqa: E402

from tests.helpers import arch_zoo  # noqa: E402

DEFAULT_OUT = REPO / "docs" / "architectures.md"
SECTION = re.compile(r"<!-- table: transformers (?P<version>\S+) -->\n.*?<!-- end table -->\n", re.S)

INTRO = f"""\
# Architecture support

Which model families each decoding strategy runs on, checked on tiny random
models built offline from configs (`tests/helpers/arch_zoo.py`; hidden size 32 (64 for xLSTM), 2-4
layers, vocabulary {arch_zoo.VOCAB}, weights initialised with a range of {arch_zoo.WIDE_INIT:g} (ten
times transformers' default) and the output layer scaled by {arch_zoo.LOGIT_SCALE:g}, so the
argmax is decisive and a wrong cached state shows in the tokens). Each family has a
target and two drafters: one blended (the target's weights blended {arch_zoo.DRAFT_BLEND:g} towards
another random initialisation, so drafts are accepted sometimes and rejected
sometimes) and one initialised independently (drafts mostly rejected, so every
rollback runs).

**path** and **rollback** say how the engine feeds the target, as its cache
probe (`utils/probe.py`, see [engine.md](engine.md#trust-no-cached-forward-the-probe))
measured it: `cached` (k tokens per forward over the cache), `stepwise` (the k
tokens one per forward, where transformers computes a multi-token cached pass
wrongly), `uncached` (the whole sequence every step, where even a single cached
step or a rollback is wrong); `crop` or `restore` (snapshot and restore, then
re-feed). The footnote gives the measurement behind a path other than `cached`.

What a tick means, per column:

- **logits** (in the speculative column): speculative decoding with the
  independent drafter at gamma 3 equals `generate` on the first prompt, and every logit any cached
  forward returned during it (target and drafter, after every crop or restore)
  equals an uncached forward of the same ids within the dtype's tolerance.
- **AR cache on / off**: greedy autoregressive decoding gives exactly the tokens
  of transformers' own `model.generate(..., do_sample=False)` on {len(arch_zoo.PROMPTS)} prompts of
  {min(map(len, arch_zoo.PROMPTS))}-{max(map(len, arch_zoo.PROMPTS))} tokens, {arch_zoo.LENGTH} new tokens (sliding windows are {arch_zoo.WINDOW} tokens:
  prompts are longer, and generation crosses the window again).
- **speculative**: the same, for speculative decoding with the family's drafter
  at gamma {", ".join(map(str, arch_zoo.GAMMAS))} (gamma 3 only for the families added in 2026, to keep the
  suite fast), and with the target as its own drafter at gamma 3
  (which must then accept every draft), KV cache on; on gemma4 also with a random
  Gemma 4 assistant (`--drafter gemma4-assistant:`) at gamma 3.
- **speculative cache off**: the family's drafter at gamma 3 without a cache.
- **NASD / NASD cache off**: n-gram drafting (3-gram storage, filler top-2) at
  gamma {", ".join(map(str, arch_zoo.GAMMAS))} (3 for the 2026 families) with the cache, gamma 3 without, on the same prompts and an
  *echo* prompt (the first prompt, half of the target's own continuation of it,
  the first prompt again), on which drafts are accepted for a while and then rejected.
- **sampling** (one sliding-window, one recurrent and one encoder-decoder family):
  under top-{arch_zoo.SAMPLING_TOP_K} sampling, the first {arch_zoo.SAMPLING_STEPS} tokens of speculative decoding and
  of NASD, drawn {arch_zoo.SAMPLING_RUNS} times from one seeded generator, follow the target's exact
  distribution (enumerated); chi-square test, failing below p = {arch_zoo.SAMPLING_ALPHA:g}.

For an encoder-decoder the prompt is the encoder input and the reference is
`generate(input_ids=prompt)` without its decoder start token. A cell other than
a tick shows the first check of that column that did not pass: `fail` (a wrong
token, with its position, or an exception's first line), `refused` (the
engine's one-line `UnsupportedCacheError`) or `skip` (this transformers version
lacks the family). `—`: not checked for that family.

Regenerate with `.venv/bin/python scripts/support_table.py` (and the same
script under the floor environment for its table); the same checks run as
tests in `tests/test_architectures.py` and `tests/test_architectures_2.py` (half the families each).
"""


class Footnotes:
    """Numbered reasons: a long refusal or failure is written once, under the table."""

    def __init__(self):
        self.texts: list[str] = []

    def mark(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"

    def lines(self) -> list[str]:
        return [f"{i}. {text}" for i, text in enumerate(self.texts, start=1)]


def column_cell(outcomes: list[tuple[str, arch_zoo.Outcome]], notes: Footnotes) -> str:
    """A tick when every check of the column passed, else the first other
    outcome: its status, a footnote with the reason, and the check's id."""
    if not outcomes:
        return "—"
    for check_id, outcome in outcomes:
        if not outcome.passed:
            mark = notes.mark(outcome.cell())
            return f"{outcome.status} {mark}" if outcome.status == "skip" else f"{outcome.status} {mark} ({check_id})"
    return "✓"


def path_cells(name: str, notes: Footnotes) -> list[str]:
    """The target's feeding path (with a footnote giving the probe's measurement) and rollback kind."""
    from kvcache.probe import probe_of

    try:
        result = probe_of(arch_zoo.build(name))
    except arch_zoo.FamilyUnavailable:
        return ["—", "—"]
    if result.path == "cached":
        return ["cached", result.rollback]
    return [f"{result.path} {notes.mark(f'{result.path}: {result.reason}')}", result.rollback or "—"]


def family_row(name: str, notes: Footnotes) -> tuple[list[str], float]:
    """The table cells of one family and the seconds its checks took."""
    fam = arch_zoo.family(name)
    start = time.perf_counter()
    paths = path_cells(name, notes)
    by_column: dict[str, list] = {c: [] for c in arch_zoo.COLUMNS}
    for spec in arch_zoo.CHECKS:
        if spec.applies(name):
            by_column[spec.column].append((spec.id, arch_zoo.run_check(name, spec)))
    seconds = time.perf_counter() - start
    cells = [f"{name}", fam.kind, *paths] + [column_cell(by_column[c], notes) for c in arch_zoo.COLUMNS]
    return cells, seconds


def table(names: list[str], say) -> str:
    header = ["family", "kind", "path", "rollback", *arch_zoo.COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes, descriptions = Footnotes(), []
    total = 0.0
    for name in names:
        cells, seconds = family_row(name, notes)
        total += seconds
        say(f"{name}: {seconds:.1f} s  " + "  ".join(cells[2:]))
        lines.append("| " + " | ".join(cells) + " |")
        fam = arch_zoo.family(name)
        descriptions.append(f"- **{name}**: `{fam.model_class}`" + (f", {fam.note}" if fam.note else ""))
    when = time.strftime("%Y-%m-%d", time.gmtime())
    head = (f"## transformers {transformers.__version__} (torch {torch.__version__}, {when}, "
            f"{total:.0f} s on 1 CPU thread)\n")
    reasons = ["", "Reasons:", "", *notes.lines()] if notes.texts else []
    if arch_zoo.GENERATE_CACHE_WRONG:
        wrong = ", ".join(sorted(arch_zoo.GENERATE_CACHE_WRONG))
        reasons += ["", f"transformers' own cached `generate` gave other tokens than its uncached `generate` on "
                        f"{wrong}: the reference there is the uncached one (the model's definition)."]
    return "\n".join([head, *lines, *reasons, "", "Families:", "", *descriptions, ""])


def merge(existing: str, version: str, section_body: str) -> str:
    """The file text with this version's section added or replaced, others kept, newest version first."""
    sections = {m["version"]: m.group(0) for m in SECTION.finditer(existing)}
    sections[version] = f"<!-- table: transformers {version} -->\n{section_body}<!-- end table -->\n"
    ordered = sorted(sections, key=lambda v: [int(x) if x.isdigit() else x for x in re.split(r"[.]", v)],
                     reverse=True)
    return INTRO + "\n" + "\n".join(sections[v] for v in ordered)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", help=f"comma-separated subset of: {', '.join(arch_zoo.FAMILIES)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown file to write (default: %(default)s)")
    parser.add_argument("--intro-only", action="store_true",
                        help="rewrite the introduction, keep every table, run no check")
    args = parser.parse_args(argv)
    existing = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    if args.intro_only:
        tables = [m.group(0) for m in SECTION.finditer(existing)]
        args.out.write_text(INTRO + "\n" + "\n".join(tables), encoding="utf-8")
        print(f"rewrote the introduction of {args.out} ({len(tables)} tables kept)")
        return 0
    names = list(arch_zoo.FAMILIES)
    if args.families:
        names = [n.strip() for n in args.families.split(",") if n.strip()]
        unknown = [n for n in names if n not in arch_zoo.FAMILIES]
        if unknown:
            parser.error(f"unknown families: {', '.join(unknown)} (known: {', '.join(arch_zoo.FAMILIES)})")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    body = table(names, lambda line: print(line, file=sys.stderr, flush=True))
    existing = args.out.read_text(encoding="utf-8") if args.out.exists() else ""  # again: it took a while
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(merge(existing, transformers.__version__, body), encoding="utf-8")
    print(f"wrote the transformers {transformers.__version__} table to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
