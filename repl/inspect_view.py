"""``/inspect``: what both models thought at each drafted position of one round (``generation.inspection``).

Token ids become text through ``text_of`` (a tokenizer, or a trace's ``token_text``), quoted so
spaces and newlines show; block adds b and h per position, strict shows P(keep) = p(x). No torch.
"""

from __future__ import annotations

from typing import Callable

from rich.console import Group
from rich.text import Text

from generation.inspection import Inspection, Tops
from generation.result import Round
from repl.runs import StrategyRun

ACCEPTED, REJECTED, UNJUDGED, TARGET = "green", "red", "dim", "bold blue"
BLOCK_LEGEND = "block: b = running ratio, h = threshold its coin was compared with"
STRICT_NOTE = ("strict: a draft is kept iff it equals the target's own draw, so it is kept with probability "
               "p(x); the token after the stop is a plain draw from p (no residual)")
NO_NUMBERS = ("this trace holds no per-token numbers for {label} (token-tree rounds, or rounds recorded "
              "with the inspector off)")


def default_round(trace: list[Round]) -> int | None:
    """The round /inspect shows without ROUND (0-based): the first with a
    rejection, else the last that drafted; None when no round drafted."""
    drafting = [i for i, r in enumerate(trace) if r.drafted]
    rejected = [i for i in drafting if trace[i].rejected]
    return (rejected or drafting[-1:] or [None])[0]


def has_numbers(run: StrategyRun) -> bool:
    return run.result is not None and any(r.inspection is not None for r in run.result.trace)


def quoted(text: str) -> str:
    """A token's text with its whitespace visible: ``' the'``, ``'\\n'``."""
    return repr(text)


def _tops(tops: Tops, text_of: Callable[[int], str]) -> str:
    return " · ".join(f"{quoted(text_of(t))} {v:.3f}" for t, v in tops) or "-"


def _verdict(i: int, rnd: Round, rule: str) -> tuple[str, str]:
    """Accepted, rejected or not judged; block tests every position and keeps up to the last
    that passed, so every draft after what it kept failed its test."""
    if i < rnd.accepted:
        return "accepted", ACCEPTED
    if rnd.token is not None and (i == rnd.accepted or rule == "block"):
        return "rejected", REJECTED
    return "not judged", UNJUDGED


def _header(run: StrategyRun, index: int, rnd: Round, rule: str) -> Text:
    trace = run.result.trace
    text = Text(f"{run.label} · round {index + 1} of {len(trace)} · γ {rnd.gamma} · drafted {len(rnd.drafted)}"
                f" · accepted {rnd.accepted}", style="bold")
    if rnd.token is None:
        text.append(" · ended inside the accepted drafts (an end token or the length budget)")
    elif rnd.bonus:
        text.append(" · then the bonus token (every draft accepted)")
    elif rnd.drafted and rule == "block":
        text.append(" · then the target's own token after the last draft whose test passed")
    elif rnd.drafted:
        text.append(" · then the target's own token at the first rejection")
    else:
        text.append(" · a plain target step (nothing drafted)")
    return text


def _notes(ins: Inspection) -> list[Text]:
    notes = []
    if ins.one_hot_q and ins.positions:
        notes.append("q is one-hot: n-gram drafts are deterministic (q(x) = 1, entropy 0), "
                     "so the draft is accepted with probability p(x)")
    if ins.shown == "softmax":
        notes.append("greedy: p and q shown are the models' softmax at temperature 1; the rule "
                     "accepts a draft iff it is p's top-1, so its acceptance probability is 1 or 0")
    if ins.rule == "strict" and ins.positions:
        notes.append(STRICT_NOTE)
    if _has_block_numbers(ins):
        notes.append(BLOCK_LEGEND)
    return [Text(n, style="dim") for n in notes]


def _has_block_numbers(ins: Inspection) -> bool:
    return any(pos.ratio is not None for pos in ins.positions)


def _accept_label(ins: Inspection) -> str:
    """What ``Position.accept`` is under the round's rule."""
    if ins.shown == "softmax":
        return "accept (greedy rule)"
    return "P(keep) = p(x)" if ins.rule == "strict" else "min(1, p/q)"


def _residual_label(ins: Inspection) -> str:
    """The distribution the token after the stop was drawn from."""
    if ins.rule == "block":
        return "scaled residual norm(max(0, b·p - q))"
    return "residual norm(max(0, p - q))"


def round_view(run: StrategyRun, index: int, text_of: Callable[[int], str]) -> Group:
    """Round ``index`` (0-based) of a drafting run, position by position."""
    rnd = run.result.trace[index]
    ins = rnd.inspection
    parts: list = [_header(run, index, rnd, ins.rule if ins is not None else "residual")]
    if ins is None:
        parts.append(Text("this round has no per-token numbers (recording was off)", style="yellow"))
        return Group(*parts)
    parts += _notes(ins)
    for i, (x, pos) in enumerate(zip(rnd.drafted, ins.positions)):
        verdict, style = _verdict(i, rnd, ins.rule)
        line = Text(f"{i:>2} ")
        line.append(quoted(text_of(x)), style=style)
        line.append(f"  {verdict}", style=style)
        line.append(f"  q(x) {pos.q:.3f} · p(x) {pos.p:.3f} · {_accept_label(ins)} {pos.accept:.3f} · ")
        if pos.ratio is not None and pos.threshold is not None:
            line.append(f"b {pos.ratio:.3f} · h {pos.threshold:.3f} · ")
        line.append(f"H(p) {pos.entropy_p:.2f} · H(q) {pos.entropy_q:.2f} nats")
        parts.append(line)
        parts.append(Text(f"     p top: {_tops(pos.p_top, text_of)}", style="dim"))
        parts.append(Text(f"     q top: {_tops(pos.q_top, text_of)}", style="dim"))
        if i == rnd.accepted and verdict == "rejected" and ins.residual is not None:
            residual = Text(f"     {_residual_label(ins)} top: {_tops(ins.residual, text_of)} → drawn: ")
            residual.append(quoted(text_of(rnd.token)), style=TARGET)
            parts.append(residual)
    if rnd.token is not None and ins.token_p is not None:
        line = Text(f"{rnd.accepted:>2} ")
        line.append(quoted(text_of(rnd.token)), style=TARGET)
        kind = "bonus" if rnd.bonus else ("resampled" if rnd.drafted else "target step")
        if kind == "resampled" and ins.rule == "strict":
            kind = "target's draw"
        line.append(f"  {kind}  p {ins.token_p:.3f} · H(p) {ins.token_entropy:.2f} nats")
        parts.append(line)
        parts.append(Text(f"     p top: {_tops(ins.token_top, text_of)}", style="dim"))
    return Group(*parts)


class InspectError(ValueError):
    """/inspect cannot show what was asked; the message is one line."""


def pick(runs: list[StrategyRun], strategy: str | None, round_word: str | None) -> tuple[StrategyRun, int]:
    """The run and 0-based round /inspect shows for ``[STRATEGY] [ROUND]`` (ROUND from 1)."""
    if strategy is None:
        run = next((r for r in runs if r.drafting and r.result is not None), None)
        if run is None:
            raise InspectError("the last prompt has no finished speculative or NASD run to inspect")
    else:
        run = next((r for r in runs if r.key == strategy), None)
        if run is None:
            raise InspectError(f"{strategy} did not run on the last prompt")
        if not run.drafting:
            raise InspectError(f"{run.label} drafts nothing: /inspect shows speculative or ngram (NASD)")
        if run.result is None:
            raise InspectError(f"{run.label} failed on the last prompt: nothing to inspect")
    trace = run.result.trace
    if round_word is None:
        index = default_round(trace)
        if index is None:
            raise InspectError(f"{run.label} drafted nothing on the last prompt: no round to inspect")
        return run, index
    number = int(round_word)
    if not 1 <= number <= len(trace):
        raise InspectError(f"{run.label} has {len(trace)} rounds: ROUND must be between 1 and {len(trace)}, "
                           f"got {number}")
    return run, number - 1
