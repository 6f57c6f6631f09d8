"""The copy ceiling over a benchmark's prompts (``analysis.ceiling``), beside the copying drafters'
tokens per target call.

Under greedy every lossless variant makes target AR's output, so it is computed once per γ from
target AR's first-repeat outputs, summed over the prompts; a conversation's later turn as target AR
saw it, and per turn too.
"""

from __future__ import annotations

from collections.abc import Sequence

from analysis.ceiling import MAX_TOKENS, copy_ceiling
from bench.records import RunRecord
from bench.runner import FollowUp, Session

# The variants that copy from the text (their tokens per call are what the ceiling bounds).
COPYING = frozenset({"ngram", "hf_prompt_lookup", "arctic_suffix"})


def target_prompts(records: Sequence[RunRecord], sessions: Sequence[Session],
                   follow_up: FollowUp | None = None) -> list[tuple[int, list[int], list[int]]]:
    """(turn, prompt ids, target AR's output) of every step target AR ran in the first repeat: a
    step's own ids, or for a conversation's later turn (with ``follow_up``) the turns so far with
    target AR's answers, as the benchmark built them for it. The turn is 1 outside conversations."""
    outputs = {r.prompt_id: list(r.tokens) for r in records if r.strategy == "target" and r.repeat == 0}
    out = []
    for session in sessions:
        answers: list[list[int]] = []
        for position, step in enumerate(session.steps, start=1):
            output = outputs.get(step.prompt.id)
            if output is None:
                break
            if session.conversation and position > 1:
                if follow_up is None:
                    break
                ids = follow_up(list(session.turns[:position]), answers)
            else:
                ids = list(step.ids)
            out.append((position if session.conversation else 1, ids, output))
            answers.append(output)
    return out


def copy_ceilings(records: Sequence[RunRecord], sessions: Sequence[Session], length: int,
                  follow_up: FollowUp | None = None) -> dict[int, dict]:
    """Per γ of a copying variant: ``prompts`` counted and the ceiling's tokens per target call after a
    1- and a 2-token match (``after_1``, ``after_2``), per turn too under ``by_turn``; prompts over
    ``analysis.ceiling.MAX_TOKENS`` left out. Empty without target AR's outputs or a copying variant."""
    gammas = sorted({r.gamma for r in records if r.gamma and r.strategy in COPYING})
    steps = [(turn, ids, output) for turn, ids, output in target_prompts(records, sessions, follow_up)
             if len(ids) + len(output) <= MAX_TOKENS]
    out: dict[int, dict] = {}
    for gamma in gammas if steps else ():
        rows = [(turn, match, copy_ceiling(ids, output, gamma, length, match=match))
                for turn, ids, output in steps for match in (1, 2)]

        def numbers(turn: int | None = None) -> dict:
            picked = [(match, c) for t, match, c in rows if turn in (None, t)]
            entry: dict = {"prompts": sum(match == 1 for match, _ in picked)}
            for match in (1, 2):
                ceilings = [c for m, c in picked if m == match]
                entry[f"after_{match}"] = sum(c.tokens for c in ceilings) / sum(c.calls for c in ceilings)
            return entry

        out[gamma] = numbers()
        turns = sorted({turn for turn, _, _ in steps})
        if turns != [1]:
            out[gamma]["by_turn"] = {str(turn): numbers(turn) for turn in turns}
    return out


def ceiling_lines(ceilings: dict[int, dict]) -> list[str]:
    """The report's header line for the ceilings, or none."""
    if not ceilings:
        return []

    def per_turn(c: dict) -> str:
        turns = c.get("by_turn") or {}
        return (" (" + ", ".join(f"turn {t}: {n['after_1']:.2f} and {n['after_2']:.2f}" for t, n in turns.items())
                + ")") if turns else ""

    prompts = next(iter(ceilings.values()))["prompts"]
    per_gamma = "; ".join(f"γ {gamma}: {c['after_1']:.2f} after a 1-token match, {c['after_2']:.2f} after 2"
                          + per_turn(c) for gamma, c in ceilings.items())
    return [f"copy ceiling (tokens per target call; target AR's outputs of {prompts} prompts; the most any "
            f"drafter copying from the prompt and output could make, with hindsight): {per_gamma}"]
