"""The copy ceiling over a benchmark's prompts (``analysis.ceiling``): beside the copying drafters'
tokens per target call, the most any drafter copying from the prompt and output could have made.

Under greedy decoding every lossless variant makes target AR's output, so the ceiling is
computed once per γ from target AR's first-repeat outputs and the prompts' ids, summed over
the prompts (tokens over target calls, as the summary counts them). A conversation's later
turn is left out: its ids are built from each variant's own earlier answers.
"""

from __future__ import annotations

from collections.abc import Sequence

from analysis.ceiling import MAX_TOKENS, copy_ceiling
from bench.records import RunRecord
from bench.runner import Session

# The variants that copy from the text (their tokens per call are what the ceiling bounds).
COPYING = frozenset({"ngram", "hf_prompt_lookup", "arctic_suffix"})


def fixed_prompts(sessions: Sequence[Session]) -> dict[str, list[int]]:
    """Each step's ids by prompt id, where they are fixed (not a conversation's later turn)."""
    return {step.prompt.id: list(step.ids) for session in sessions
            for position, step in enumerate(session.steps, start=1)
            if position == 1 or not session.conversation}


def copy_ceilings(records: Sequence[RunRecord], sessions: Sequence[Session], length: int) -> dict[int, dict]:
    """Per γ of a copying variant: ``prompts`` counted and the ceiling's tokens per target call after
    a 1-token match (``after_1``) and a 2-token one (``after_2``) over them. Empty without a
    greedy target AR run (the caller asks only under greedy) or a copying variant."""
    gammas = sorted({r.gamma for r in records if r.gamma and r.strategy in COPYING})
    prompts = fixed_prompts(sessions)
    outputs = {r.prompt_id: r.tokens for r in records
               if r.strategy == "target" and r.repeat == 0 and r.prompt_id in prompts
               and len(prompts[r.prompt_id]) + len(r.tokens) <= MAX_TOKENS}
    out: dict[int, dict] = {}
    for gamma in gammas if outputs else ():
        entry: dict = {"prompts": len(outputs)}
        for match in (1, 2):
            ceilings = [copy_ceiling(prompts[pid], tokens, gamma, length, match=match) for pid, tokens in outputs.items()]
            entry[f"after_{match}"] = sum(c.tokens for c in ceilings) / sum(c.calls for c in ceilings)
        out[gamma] = entry
    return out


def ceiling_lines(ceilings: dict[int, dict]) -> list[str]:
    """The report's header line for the ceilings, or none."""
    if not ceilings:
        return []
    prompts = next(iter(ceilings.values()))["prompts"]
    per_gamma = "; ".join(f"γ {gamma}: {c['after_1']:.2f} after a 1-token match, {c['after_2']:.2f} after 2"
                          for gamma, c in ceilings.items())
    return [f"copy ceiling (tokens per target call; target AR's outputs of {prompts} prompts; the most any "
            f"drafter copying from the prompt and output could make, with hindsight): {per_gamma}"]
