"""What one prompt produced, and the numbers read from it; no torch.

:class:`StrategyRun` and :class:`PromptRun` are filled by the runner live and rebuilt from a trace by
``infer.py --replay``, so every view reads the same objects; :meth:`PromptRun.finish` computes each
run's report once (``analysis.report``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from analysis.divergence import Divergence, Evidence, Reference, explain, held_to_target
from analysis.report import (
    DRAFTING, PromptFacts, RunReport, Why, call_cost, decode_speedup, run_report, speedup,
    strategy_record, usable, why_of,
)
from analysis.speedup import ar_step_from_result
from generation.result import GenerationResult, Round, first_divergence
from repl.settings import STRATEGY_LABELS

PIECE_WINDOW = 8  # tokens of left context used to decode one token's text


# ------------------------------------------------------------ token pieces

def token_pieces(tokenizer, context: list[int], tokens: list[int]) -> list[str]:
    """The text each of ``tokens`` adds after ``context`` (special tokens shown): the difference between
    decoding a short window with and without it, so multi-byte characters and spaces stay whole."""
    pieces, seq = [], list(context[-PIECE_WINDOW:])
    for token in tokens:
        before = tokenizer.decode(seq, skip_special_tokens=False)
        after = tokenizer.decode(seq + [token], skip_special_tokens=False)
        pieces.append(after[len(before):] if after.startswith(before) else tokenizer.decode([token]))
        seq = (seq + [token])[-PIECE_WINDOW:]
    return pieces


def round_pieces(tokenizer, prompt_ids: list[int], trace: list[Round]) -> list[dict]:
    """Per round, ``{"drafted": [...], "token": str | None}``: accepted drafts decoded after the text so
    far, rejected ones and the target's token after the accepted drafts. Traces store these."""
    out, context = [], list(prompt_ids)
    for rnd in trace:
        accepted = list(rnd.drafted[: rnd.accepted])
        after = context + accepted
        drafted = token_pieces(tokenizer, context, accepted) + token_pieces(tokenizer, after, list(rnd.rejected))
        token = None if rnd.token is None else token_pieces(tokenizer, after, [rnd.token])[0]
        piece = {"drafted": drafted, "token": token}
        if getattr(rnd, "tree_tokens", ()):
            # The candidates that lost where the path stopped (the stop node's children).
            stop = rnd.path[-1] if rnd.path else -1
            losers = [t for t, p in zip(rnd.tree_tokens, rnd.tree_parents) if p == stop]
            piece["losers"] = token_pieces(tokenizer, after, losers) if losers else []
        out.append(piece)
        context = after + ([rnd.token] if rnd.token is not None else [])
    return out


# ------------------------------------------------------------ one strategy

@dataclass
class StrategyRun:
    """One strategy's outcome: a result and its decoded text, or an error line. ``pieces``:
    :func:`round_pieces`; ``other_load``: other processes' load while it ran (None: unknown);
    ``report``: what it came to beside target AR, set by :meth:`PromptRun.finish`."""

    key: str
    result: GenerationResult | None = None
    text: str = ""
    error: str | None = None
    pieces: list[dict] | None = None
    other_load: float | None = None
    report: RunReport | None = field(default=None, repr=False, compare=False)
    evidence: Evidence | None = field(default=None, repr=False, compare=False)  # a trace's reference numbers

    @property
    def label(self) -> str:
        return STRATEGY_LABELS[self.key]

    @property
    def usable(self) -> bool:
        """A complete result to compare against (not failed, not interrupted)."""
        return usable(self.result)

    @property
    def drafting(self) -> bool:
        return self.key in DRAFTING


# ------------------------------------------------------------ one prompt

@dataclass
class PromptRun:
    """Every strategy's run on one prompt, and the comparisons between them. ``settings``:
    ``Settings.to_dict``; ``token_text``: the text of token ids the inspector names (in a trace);
    ``target_dtype``: "" when unknown; ``machine_load``: ``utils.machine_load.load_record`` over the
    prompt, None when not measured."""

    prompt: str
    prompt_ids: list[int]
    greedy: bool
    runs: list[StrategyRun] = field(default_factory=list)
    interrupted: bool = False
    settings: dict = field(default_factory=dict)
    token_text: dict[int, str] = field(default_factory=dict)
    target_dtype: str = ""
    machine_load: dict | None = None
    _ceilings: dict = field(default_factory=dict, repr=False, compare=False)   # copy_ceiling_of's, per run and γ
    # The target's one-token step (seconds) the runner timed at load (``Runner.warm_up``): the plain
    # step the predictions take when target AR did not run this prompt; None when not measured.
    load_step_s: float | None = None
    # The turns that step was timed over (``engine.widths.plain_step_timing``): a prediction priced
    # from it carries their spread (``Why.predicted_interval``); () when not kept (old traces).
    load_step_samples: tuple[float, ...] = ()
    # The /whatif projections of these runs, by topic ("batch", "context", "machine H100"): the HTML
    # report draws them (``repl.whatif_view.WhatIf``); not kept in a trace file.
    whatifs: dict = field(default_factory=dict, repr=False, compare=False)

    def baseline(self) -> StrategyRun | None:
        """The target autoregressive run, when it ran to completion."""
        run = next((r for r in self.runs if r.key == "target"), None)
        return run if run is not None and run.usable else None

    def speedup(self, run: StrategyRun) -> float | None:
        """tokens/s of ``run`` over tokens/s of target autoregressive decoding (the report's)."""
        return run.report.speedup if run.report is not None else speedup(run.result, self._base_result())

    def decode_speedup(self, run: StrategyRun) -> float | None:
        """Decode tokens/s of ``run`` over target AR's (``analysis.report.decode_speedup``)."""
        if run.report is not None:
            return run.report.decode_speedup
        return decode_speedup(run.result, self._base_result())

    def call_cost(self, run: StrategyRun) -> float | None:
        """Seconds per target call of ``run`` over target AR's (``analysis.report.call_cost``)."""
        return run.report.call_cost if run.report is not None else call_cost(run.result, self._base_result())

    def _base_result(self) -> GenerationResult | None:
        base = self.baseline()
        return None if base is None else base.result

    def divergence(self, run: StrategyRun) -> tuple[bool | None, int | None]:
        """(identical to target AR, first differing token index) under greedy; (None, None) when the check
        does not apply (sampling, no baseline, an incomplete run, drafter AR: ``held_to_target``)."""
        base = self.baseline()
        if not self.greedy or base is None or not run.usable or not held_to_target(run.key):
            return None, None
        index = first_divergence(run.result.tokens, base.result.tokens)
        return index is None, index

    def explained(self, run: StrategyRun, reference: Reference | None = None) -> Divergence | None:
        """Where and why ``run``'s greedy output first differs from target AR's (``analysis.divergence``,
        against ``reference`` or as read back from a trace); None when identical or not compared."""
        if self.divergence(run)[0] is not False:
            return None
        base = self.baseline().result
        return explain(base.tokens, base.decisions, run.result.tokens, run.result.decisions,
                       reference=reference, evidence=run.evidence)

    def ar_step_s(self) -> float | None:
        """Target AR's seconds per token (prefill left out), when it ran to completion."""
        base = self.baseline()
        return None if base is None else ar_step_from_result(base.result)

    def plain_step(self) -> tuple[float | None, str | None]:
        """(seconds, source) of the plain target step the predictions are ratios to: target AR's decode step
        on this prompt (``"target AR"``), else the step timed at load (``"load"``), else (None, None)."""
        ar_step = self.ar_step_s()
        if ar_step is not None:
            return ar_step, "target AR"
        if self.load_step_s:
            return self.load_step_s, "load"
        return None, None

    def rtt_ms(self) -> float:
        """The what-if round trip the prompt ran with (``/rtt``; 0 in old traces)."""
        return float(self.settings.get("rtt") or 0.0)

    def facts(self) -> PromptFacts:
        """What a run's report reads besides the run (``analysis.report.PromptFacts``)."""
        return PromptFacts(self.prompt_ids, self.greedy, self.settings, self._base_result(), self.plain_step(),
                           tuple(self.load_step_samples))

    def finish(self, reference: Reference | None = None) -> None:
        """Compute each run's report once the prompt's runs have ended (``reference``: the target's
        ``analysis.reference``; None for a trace, whose evidence is in the file)."""
        facts = self.facts()
        for run in self.runs:
            explained = self.explained(run, reference)
            if explained is not None:
                run.evidence = explained.evidence
            run.report = run_report(run.key, run.result, facts, self.divergence(run), self._ceilings, explained)

    def report(self, run: StrategyRun) -> RunReport:
        """``run``'s report: the one kept when the prompt finished, else computed now (a live
        panel drawn before the prompt's last strategy ran)."""
        if run.report is not None:
            return run.report
        return run_report(run.key, run.result, self.facts(), self.divergence(run), self._ceilings,
                          self.explained(run))

    def why(self, run: StrategyRun, rtt_ms: float | None = None) -> Why | None:
        """Acceptance statistics and the speedup model for a drafting run (``analysis.report.Why``):
        the report's, or, at another ``rtt_ms`` than the prompt's ``/rtt``, computed for it."""
        if rtt_ms is None or rtt_ms == self.rtt_ms():
            return self.report(run).why
        return why_of(run.key, run.result, self.facts(), rtt_ms, self._ceilings)

    def strategy_dict(self, run: StrategyRun) -> dict:
        """One strategy's JSON entry (``analysis.report.strategy_record``)."""
        report = self.report(run) if run.result is not None else None
        return strategy_record(run.label, run.error, run.result, run.text, run.other_load, report)

    def to_dict(self) -> dict:
        """The JSON object scripted mode prints for this prompt."""
        return {
            "prompt": self.prompt,
            "prompt_tokens": len(self.prompt_ids),
            "plain_step_at_load_s": self.load_step_s,
            "plain_step_at_load_samples_s": list(self.load_step_samples),
            "interrupted": self.interrupted,
            "machine_load": self.machine_load,
            "strategies": {run.key: self.strategy_dict(run) for run in self.runs},
        }
