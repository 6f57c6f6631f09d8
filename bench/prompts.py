"""Prompt sets: the built-in one and files in Spec-Bench's question format.

One JSON object per line with ``question_id``, ``category`` and ``turns``. A run uses one turn of each
item, or with ``--multi-turn`` every item of two turns or more as a conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from utils.builtin_prompts import BUILTIN
from utils.text_files import UnreadableText, read_text

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
    turns = _turns(item)
    if turn > len(turns):
        return None
    return Prompt(str(item["question_id"]), str(item["category"]), turns[turn - 1])


def _turns(item) -> list[str]:
    """An item's ``turns``: a list of strings (TypeError otherwise, KeyError when missing)."""
    if not isinstance(item, dict):
        raise TypeError("the line is not a JSON object")
    turns = item["turns"]
    if not isinstance(turns, list) or not all(isinstance(text, str) for text in turns):
        raise TypeError("turns is not a list of strings")
    return turns


def read_spec_bench(path: str | Path, *, turn: int = 1) -> list[Prompt]:
    """Every item of a Spec-Bench-format file that has the asked-for turn."""
    return [p for p in _read_items(path, lambda line: parse_spec_bench_line(line, turn=turn)) if p is not None]


def read_conversations(path: str | Path) -> list[tuple[Prompt, ...]]:
    """Every item of a Spec-Bench-format file with two turns or more, as one Prompt per turn
    (ids ``QID/1``, ``QID/2``...; the text of each is that turn's user message)."""
    return [c for c in _read_items(path, _conversation) if len(c) > 1]


def _conversation(line: str) -> tuple[Prompt, ...]:
    item = json.loads(line)
    return tuple(Prompt(f"{item['question_id']}/{i}", str(item["category"]), text)
                 for i, text in enumerate(_turns(item), start=1))


def _read_items(path: str | Path, parse) -> list:
    """``parse(line)`` of every non-empty line; PromptFileError (one line) for a bad file or item."""
    path = Path(path)
    try:
        lines = read_text(path).splitlines()
    except UnreadableText as exc:
        raise PromptFileError(f"cannot read prompt file {path}: {exc}") from None
    if not any(line.strip() for line in lines):
        raise PromptFileError(f"prompt file {path} holds no Spec-Bench items")
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append(parse(line))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PromptFileError(
                f"{path}:{number}: not a Spec-Bench item (question_id, category, turns): {exc}"
            ) from None
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
    """Keep the prompts of ``categories`` (all if None), the first ``limit`` per category in file order."""
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


def load_conversations(source: str, *, categories: list[str] | None = None,
                       limit: int | None = None) -> list[tuple[Prompt, ...]]:
    """The multi-turn items of a Spec-Bench-format file, filtered by category and limit
    (``builtin`` has none: PromptFileError)."""
    if source == "builtin":
        raise PromptFileError("the built-in prompts have one turn each: --multi-turn needs a prompt file "
                              "with two-turn items (Spec-Bench's question.jsonl, --categories mt_bench)")
    conversations = read_conversations(source)
    firsts = select([c[0] for c in conversations], categories=categories, limit=limit)
    kept = {p.id for p in firsts}
    return [c for c in conversations if c[0].id in kept]


def conversation_ids(tokenizer, turns: list[str], answers: list[list[int]], *, chat: bool = True) -> list[int]:
    """Prompt ids of turn ``len(answers) + 1`` of a conversation: the chat template of [user, assistant,
    ..., user] with each answer decoded to text; without one, the ids concatenated (the first prompt,
    each answer verbatim, then each later turn's text after a blank line)."""
    if len(turns) != len(answers) + 1:
        raise ValueError(f"{len(turns)} turns need {len(turns) - 1} answers, got {len(answers)}")
    from utils.vocab import has_chat_template, template_ids

    if chat and has_chat_template(tokenizer):
        messages = []
        for text, answer in zip(turns, answers + [None]):
            messages.append({"role": "user", "content": text})
            if answer is not None:
                messages.append({"role": "assistant",
                                 "content": tokenizer.decode(answer, skip_special_tokens=True)})
        return template_ids(tokenizer, messages)
    ids = chat_ids(tokenizer, turns[0], chat=False)
    for text, answer in zip(turns[1:], answers):
        ids += [int(i) for i in answer]
        ids += [int(i) for i in tokenizer("\n\n" + text, add_special_tokens=False).input_ids]
    return ids


def chat_ids(tokenizer, text: str, *, chat: bool = True) -> list[int]:
    """Prompt token ids as the REPL encodes them (``utils.vocab.encode_prompt``): every strategy and
    peer gets the same ids."""
    from utils.vocab import encode_prompt

    return encode_prompt(tokenizer, text, chat=chat)
