"""Prompt sets: the built-in one and files in Spec-Bench's question format.

Spec-Bench format: one JSON object per line with ``question_id``, ``category``
and ``turns`` (a list of user messages). A benchmark run uses one turn of each
item (the first by default); items without that turn are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from utils.builtin_prompts import BUILTIN

# Spec-Bench's 80 MT-bench items carry these eight categories; "mt_bench" selects all.
MT_BENCH_CATEGORIES = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


class PromptFileError(ValueError):
    """A prompt file that cannot be read; the message is one line."""


def builtin_prompts() -> list[Prompt]:
    """The shipped prompt set, ids numbered within each category (``chat-1``...)."""
    seen: dict[str, int] = {}
    out = []
    for category, text in BUILTIN:
        seen[category] = seen.get(category, 0) + 1
        out.append(Prompt(f"{category}-{seen[category]}", category, text))
    return out


def parse_spec_bench_line(line: str, *, turn: int = 1) -> Prompt | None:
    """One Spec-Bench item as a Prompt using its ``turn``-th turn (1-based), or None."""
    item = json.loads(line)
    turns = item["turns"]
    if turn > len(turns):
        return None
    return Prompt(str(item["question_id"]), str(item["category"]), turns[turn - 1])


def read_spec_bench(path: str | Path, *, turn: int = 1) -> list[Prompt]:
    """Every item of a Spec-Bench-format file that has the asked-for turn."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptFileError(f"cannot read prompt file {path}: {exc.strerror}") from None
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            prompt = parse_spec_bench_line(line, turn=turn)
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PromptFileError(
                f"{path}:{number}: not a Spec-Bench item (question_id, category, turns): {exc}"
            ) from None
        if prompt is not None:
            out.append(prompt)
    return out


def expand_categories(categories: list[str] | None) -> set[str] | None:
    """The category names to keep; ``mt_bench`` stands for its eight categories."""
    if not categories:
        return None
    out = set()
    for name in categories:
        out.update(MT_BENCH_CATEGORIES if name == "mt_bench" else (name,))
    return out


def select(prompts: list[Prompt], *, categories: list[str] | None = None,
           limit: int | None = None) -> list[Prompt]:
    """Keep the prompts of ``categories`` (all if None), at most ``limit`` per category.

    The file order is kept, so ``limit`` takes the first items of each category.
    """
    wanted = expand_categories(categories)
    counts: dict[str, int] = {}
    out = []
    for prompt in prompts:
        if wanted is not None and prompt.category not in wanted:
            continue
        if limit is not None and counts.get(prompt.category, 0) >= limit:
            continue
        counts[prompt.category] = counts.get(prompt.category, 0) + 1
        out.append(prompt)
    return out


def load_prompts(source: str = "builtin", *, categories: list[str] | None = None,
                 limit: int | None = None, turn: int = 1) -> list[Prompt]:
    """``builtin`` or a Spec-Bench-format file, filtered by category and limit."""
    prompts = builtin_prompts() if source == "builtin" else read_spec_bench(source, turn=turn)
    return select(prompts, categories=categories, limit=limit)


def chat_ids(tokenizer, text: str, *, chat: bool = True) -> list[int]:
    """Prompt token ids, encoded as the REPL encodes them (``utils.vocab.encode_prompt``).

    Every strategy and every peer gets these same ids.
    """
    from utils.vocab import encode_prompt

    return encode_prompt(tokenizer, text, chat=chat)
