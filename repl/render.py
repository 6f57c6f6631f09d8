"""What the REPL shows of a prompt's runs, as rich renderables: panels, the debug view, the comparison
table, and the one-line texts ``/stats`` and the HTML report share.

Model text only enters rich as :class:`rich.text.Text`, never markup, so brackets in a model's output
print as they are. No torch: ``infer.py --replay`` renders with it.
"""

from __future__ import annotations

import io

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from analysis.acceptance import acceptance_counts
from analysis.report import DRAFTING, Why, gamma_cap, plain_step_words
from analysis.sources import NO_MATCH
from generation.result import GenerationResult
from repl.runs import PromptRun, StrategyRun, round_pieces
from repl.settings import settings_from_dict
from utils.devices import HALF_DTYPES, half_precision_reason
from utils.machine_load import busy_warning
from utils.options import MATCH_STORAGES

STRATEGY_COLOURS = {"speculative": "green", "ngram": "cyan", "lookahead": "yellow", "target": "blue",
                    "drafter": "magenta"}
ACCEPTED = "green"
REJECTED = "red strike"
TARGET = "bold blue"
BONUS = "bold magenta"
GAMMA_MARK = "dim"
LOSER = "dim strike"
SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def make_console(*, stderr: bool = False) -> Console:
    """A console that never reads markup, emoji codes or highlights in strings."""
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False)


def present(*items) -> list:
    """The items that are not None."""
    return [item for item in items if item is not None]


def dim(*lines: str | None) -> list[Text]:
    """The lines that are not None, as dim text."""
    return [Text(line, style="dim") for line in lines if line is not None]


# ------------------------------------------------------------------- metrics

def _metrics(run: StrategyRun) -> Text:
    r = run.result
    parts = [f"{len(r.tokens)} tokens", f"{r.seconds:.2f} s", f"{r.tokens_per_second:.1f} tokens/s"]
    if run.key in DRAFTING:
        # the result's own tallies: equal to analysis.acceptance's draft acceptance rate
        parts += [acceptance_words(r), f"{r.tokens_per_target_call:.2f} tokens/target call"]
    calls = "drafter forward passes" if run.key == "drafter" else "target forward passes"
    parts.append(f"{r.target_calls} {calls}")
    if run.key == "speculative":
        parts.append(f"{r.drafter_calls} drafter forward passes")
    parts.append(f"stop: {r.stop_reason}")
    return Text(" · ".join(parts), style="dim")


def acceptance_words(result: GenerationResult) -> str:
    """``acceptance 70.0% (7/10 drafts)``, or ``acceptance n/a (nothing drafted)``: a rate over no
    drafts is no rate."""
    if not result.drafted:
        return "acceptance n/a (nothing drafted)"
    return f"acceptance {result.acceptance_rate:.1%} ({result.accepted}/{result.drafted} drafts)"


def acceptance_text(result: GenerationResult) -> Text | None:
    """``mean acceptance length 2.33 · per position 67% 33% · conditional 67% 50%``: the
    engines' numbers (analysis.acceptance); None when no round drafted."""
    counts = acceptance_counts(result.trace)
    if not counts.drafting_rounds:
        return None

    def percents(rates: list[float]) -> str:
        return " ".join(f"{rate:.0%}" for rate in rates)

    return Text(f"mean acceptance length {counts.mean_acceptance_length:.2f} · per position "
                f"{percents(counts.acceptance_rate_per_position)} · conditional "
                f"{percents(counts.conditional_acceptance_per_position)}", style="dim")


def tree_text(result: GenerationResult) -> Text | None:
    """One line on the tree: what it cost and bought, or why a chain ran instead."""
    if result.tree_fallback:
        return Text(result.tree_fallback, style="yellow")
    from analysis.trees import tree_summary

    stats = tree_summary(result.trace, tokens=len(result.tokens), target_calls=result.target_calls)
    if not result.tree or stats is None:
        return None
    by_rank = stats["taken_by_rank"]
    rule = " (children drawn from q, recursive rejection sampling)" if result.tree_rule == "sampled" else ""
    return Text(f"tree ≤{result.tree}{rule}: {stats['mean_nodes']:.1f} nodes/round · accepted depth "
                f"{stats['mean_accepted_depth']:.2f} · children taken by rank "
                + " ".join(f"{k}:{v}" for k, v in by_rank.items())
                + f" · a rank>0 child saved {stats['rounds_saved_by_rank_above_0']}/{stats['rounds']} rounds",
                style="dim")


def hybrid_text(result: GenerationResult) -> Text | None:
    """``hybrid L 4: retrieval 11 rounds, accepted 10/15 drafts (67%) · model 12 rounds, accepted
    7/48 drafts (15%)``: the rounds of each kind and their acceptance; None without the hybrid."""
    info = getattr(result, "hybrid", None) or {}
    if not info:
        return None
    parts = []
    for kind in ("retrieval", "model"):
        rounds, drafted, accepted = (info.get(key, {}).get(kind, 0) for key in ("rounds", "drafted", "accepted"))
        share = f" ({accepted / drafted:.0%})" if drafted else ""
        parts.append(f"{kind} {rounds} rounds, accepted {accepted}/{drafted} drafts{share}")
    return Text(f"hybrid L {info.get('L', '?')}: " + " · ".join(parts), style="dim")


def fill_text(result: GenerationResult, *, widths: bool = False) -> Text | None:
    """``filled 33 rounds to a cheaper verify width: +54 drafts, 10 accepted`` (with ``widths``, the
    measured forward ms by width after it); None when the run did not fill widths."""
    info = getattr(result, "width_fill", None) or {}
    if not info:
        return None
    text = (f"filled {info.get('rounds', 0)} rounds to a cheaper verify width: +{info.get('drafts', 0)} drafts, "
            f"{info.get('accepted', 0)} accepted")
    costs = info.get("verify_ms") or {}
    if widths and costs:
        text += " · verify ms by width " + " ".join(f"{w}:{ms:.0f}" for w, ms in costs.items())
    return Text(text, style="dim")


def ceiling_text(why: Why, result: GenerationResult, storage: str = "") -> Text | None:
    """``copy ceiling at γ 16: at most 3.79 tokens a target call ...; this run 3.09`` (``Why.ceiling``),
    or why it was not computed; None without one."""
    ceiling = why.ceiling
    if not ceiling:
        return None
    if "skipped" in ceiling:
        return Text(f"copy ceiling: not computed: {ceiling['skipped']}", style="dim")
    text = (f"copy ceiling at γ {ceiling['gamma']}: at most {ceiling['after_1']:.2f} tokens a target call for any "
            f"drafter copying from this prompt and output after a 1-token match, {ceiling['after_2']:.2f} after 2 "
            f"(hindsight: where to copy, how much, where rounds fall); this run {result.tokens_per_target_call:.2f}")
    if storage not in MATCH_STORAGES:
        text += " (a table's chained look-ups can pass it)"
    return Text(text, style="dim")


def lookahead_text(result: GenerationResult) -> Text | None:
    """One line on lookahead decoding: tokens per target call, the accepted n-gram length and
    the pool; or why it ran as target AR."""
    if result.tree_fallback:
        return Text(f"{result.tree_fallback} (lookahead drafts nothing without its window: target AR)",
                    style="yellow")
    from analysis.lookahead import lookahead_summary

    stats = lookahead_summary(result.trace, tokens=len(result.tokens), target_calls=result.target_calls)
    if stats is None:
        return None
    return Text(f"lookahead: {stats['tokens_per_target_call']:.2f} tokens/target call · accepted n-gram "
                f"length {stats['accepted_ngram_length']:.2f} over {stats['rounds_with_candidates']}/"
                f"{stats['rounds']} rounds with candidates ({stats['mean_candidates']:.1f} per round) · "
                f"pool {stats['pool']} n-grams", style="dim")


PHASES = ("draft", "verify", "other")


def _phase_seconds(result: GenerationResult) -> list[float]:
    """The run's seconds drafting, verifying and in other work (``PHASES``)."""
    phases = result.phases or {}
    return [phases.get(k, 0.0) for k in PHASES]


def phases_text(result: GenerationResult) -> str:
    """``draft 0.10 s (8%) · verify 1.05 s (84%) · other 0.10 s (8%)``."""
    values = _phase_seconds(result)
    total = sum(values)
    if total <= 0:
        return "phases: not measured"
    return "phases: " + " · ".join(f"{k} {v:.2f} s ({v / total:.0%})" for k, v in zip(PHASES, values))


def cross_tokenizer_text(result: GenerationResult) -> str | None:
    """For a drafter with another tokenizer: the method, the shared vocabulary and the
    re-tokenisation cost (part of the draft time); None for any other run."""
    info = getattr(result, "cross_tokenizer", None) or {}
    if not info:
        return None
    draft = (result.phases or {}).get("draft", 0.0)
    seconds = float(info.get("retokenize_s", 0.0))
    share = f" ({seconds / draft:.0%} of draft time)" if draft > 0 else ""
    text = (f"another tokenizer ({info.get('method', '?')}): shared vocabulary "
            f"{info.get('shared_of_drafter', 0.0):.0%} of the drafter's, {info.get('shared_of_target', 0.0):.0%} "
            f"of the target's ({info.get('shared_tokens', 0)} tokens) · re-tokenisation {seconds:.3f} s{share}")
    misses = info.get("sync_misses", 0)
    return text + (f" · {misses} rounds re-spelt approximately" if misses else "")


def phase_split(result: GenerationResult) -> str:
    """The compact ``8/84/8%`` draft/verify/other split of the comparison table."""
    values = _phase_seconds(result)
    total = sum(values)
    if total <= 0:
        return "-"
    return "/".join(f"{v / total * 100:.0f}" for v in values) + "%"


def ratio_text(value: float | None) -> str:
    """``1.23x``, or ``n/a`` for None."""
    return "n/a" if value is None else f"{value:.2f}x"


def sources_lines(why: Why) -> list[Text]:
    """For a match drafter (docs/model_free.md): the rounds by the source they drafted
    from, with acceptance and mean match length, then the draft-length distribution."""
    if why.sources is None:
        return []
    def rounds(n: int) -> str:
        return f"{n} round" + ("" if n == 1 else "s")

    parts = []
    for source, c in why.sources["draft_sources"].items():
        if source == NO_MATCH:
            parts.append(f"no match {rounds(c['rounds'])}")
        else:
            parts.append(f"{source} {rounds(c['rounds'])} ({c['accepted']}/{c['drafted']} accepted, "
                         f"{c['acceptance_rate']:.0%}; match {c['mean_match_length']:.1f})")
    mean_match = why.sources["mean_match_length"]
    if mean_match is not None:
        parts.append(f"mean match {mean_match:.1f}")
    lengths = why.sources["draft_lengths"]
    histogram = " ".join(f"{k}:{c}" for k, c in lengths["rounds_by_length"].items())
    spread = (f" · p10/p50/p90 {lengths['p10']}/{lengths['p50']}/{lengths['p90']} · max {lengths['max']}"
              if "p50" in lengths else "")
    return [Text("drafts from: " + " · ".join(parts), style="dim"),
            Text(f"draft lengths (length:rounds) {histogram} · mean {lengths['mean']:.2f}{spread}", style="dim")]


def _at_gamma(why: Why, policy: str = "") -> str:
    """``at gamma 4``, or ``at draft lengths up to 16`` where the rounds chose their lengths (the
    policy's maximum, ``analysis.report.gamma_cap``), with their mean when a match drafter chose them."""
    mean = (f" (mean {why.sources['draft_lengths']['mean']:.2f})"
            if why.measured and why.sources is not None else "")
    if mean or policy == "model":
        return f"at draft lengths up to {gamma_cap(why.gamma, policy)}{mean}"
    return f"at gamma {why.gamma}"


def why_text(prompt_run: PromptRun, run: StrategyRun) -> Text | None:
    """Mean acceptance length and the speedup model, for a drafting run."""
    why = prompt_run.why(run)
    if why is None:
        return None
    policy = run.result.gamma_policy
    accepted = why.acceptance.mean_acceptance_length - 1.0
    parts = [f"mean accepted {accepted:.2f} per drafting round {_at_gamma(why, policy)}"
             + (f" ({policy})" if policy and policy != "constant" else "")
             + (f" · verify {run.result.verify_rule}" if run.result.verify_rule else "")]
    target_pending = prompt_run.settings.get("target") and not any(r.key == "target" for r in prompt_run.runs)
    if target_pending:
        parts.append("predicted speedup and best gamma: in the comparison, once target AR has run")
    elif why.predicted is None:
        parts.append("speedup model: no round timings to price")
    else:
        parts += prediction_parts(prompt_run, run, why)
    if why.what_if is not None:
        parts.append(what_if_text(why.what_if))
    return Text(" · ".join(parts), style="dim")


def est_note(why: Why) -> str:
    """`` (est.)`` after a prediction some of whose inputs were estimated, else nothing."""
    return " (est.)" if why.estimated else ""


def interval_note(why: Why) -> str:
    """`` [1.30-1.62x]`` after a prediction made without target AR (the spread of what it priced,
    ``Why.predicted_interval``), else nothing."""
    if why.predicted_interval is None:
        return ""
    low, high = why.predicted_interval
    return f" [{low:.2f}-{high:.2f}x]"


def prediction_parts(prompt_run: PromptRun, run: StrategyRun, why: Why) -> list[str]:
    """The speedup model's pieces of a panel's why line: predictions against the measured speedups
    (whole run and decode part), the best γ, the plain step's source and what was estimated."""
    priced = " (priced at the measured draft lengths)" if why.measured else ""
    decode = prompt_run.decode_speedup(run)
    if prompt_run.baseline() is None:   # no target AR run: the decode prediction is all there is
        parts = [f"predicted {ratio_text(why.predicted_steady)}{est_note(why)}{interval_note(why)} (decode part; "
                 f"first round {why.first_round_s:.2f} s left out){priced}"]
    else:
        measured = prompt_run.speedup(run)
        parts = [f"predicted {ratio_text(why.predicted)}{est_note(why)}"
                 + (f" vs measured {ratio_text(measured)}" if measured else "") + priced,
                 f"decode part (first round {why.first_round_s:.2f} s left out): predicted "
                 f"{ratio_text(why.predicted_steady)}{est_note(why)}"
                 + (f" vs measured {ratio_text(decode)}" if decode else "")]
    parts.append("best gamma -" if why.no_gamma else f"best gamma {why.best_gamma} ({ratio_text(why.best_speedup)})")
    if why.tree is not None:
        parts.append(tree_best_text(why.tree))
    parts.append(plain_step_words(why))
    others = [name for name in why.estimated if name != "plain step"]   # the plain step's words say it
    if others:
        parts.append("est.: " + ", ".join(others) + " not measured")
    return parts


def tree_best_text(tree: dict) -> str:
    """``best tree 8 nodes (1.31x; this run's budget 1.20x)``: the tree model's pick."""
    own = tree.get("predicted_speedup_at_budget")
    return (f"best tree {tree['best_nodes']} nodes ({ratio_text(tree['best_nodes_speedup'])}"
            + (f"; this run's budget {ratio_text(own)})" if own is not None else ")"))


def what_if_text(what_if) -> str:
    """``at a 20 ms round trip per target call (/rtt): predicted 1.42x (long outputs
    1.55x), best gamma 7 (1.61x)``."""
    w = what_if
    predicted = "" if w.predicted is None else f"predicted {ratio_text(w.predicted)} ("
    steady = f"long outputs {ratio_text(w.predicted_steady)}" + (")" if predicted else "")
    where = ("per target call (/rtt)" if w.measured_ms is None else
             f"per request (/rtt; measured {w.measured_ms:.1f} ms)")
    best = "" if w.best_gamma is None else f", best gamma {w.best_gamma} ({ratio_text(w.best_speedup)})"
    return f"at a {w.rtt_ms:g} ms round trip {where}: {predicted}{steady}{best}"



def strategy_panel(run: StrategyRun, prompt_ids: list[int], tokenizer, *, debug: bool,
                   prompt_run: PromptRun | None = None) -> Panel:
    """One strategy's output, its numbers and (in debug mode) its rounds. ``prompt_run`` gives the
    speedup model target AR's plain step when it ran; ``tokenizer`` may be None for a replay."""
    colour = STRATEGY_COLOURS[run.key]
    title = Text(run.label, style=f"bold {colour}")
    if run.error is not None:
        return Panel(Text(run.error, style="red"), title=title, title_align="left", border_style="red")
    r = run.result
    body: list = [Text(run.text or "(no text)", style="" if run.text else "dim")]
    if r.interrupted:
        title.append("  interrupted", style="bold yellow")
        body.append(Text(f"interrupted after {len(r.tokens)} tokens", style="yellow"))
    body += [_metrics(run), Text(phases_text(r), style="dim")]
    if run.key in DRAFTING:
        body += present(acceptance_text(r), lookahead_text(r) if run.key == "lookahead" else tree_text(r))
    body += present(hybrid_text(r), fill_text(r))
    body += dim(path_text(r.rollback), compile_text(r), network_text(r), cross_tokenizer_text(r))
    prompt_run = prompt_run or PromptRun("", list(prompt_ids), greedy=False, runs=[run])
    why = why_text(prompt_run, run)
    if why is not None:
        body.append(why)
        body += sources_lines(prompt_run.why(run))
    if debug and run.key in DRAFTING and r.trace is not None:
        if tokenizer is not None or run.pieces is not None:
            body += [Text(""), rounds_view(r, prompt_ids, tokenizer, run.pieces)]
    border = "yellow" if r.interrupted else colour
    return Panel(Group(*body), title=title, title_align="left", border_style=border)


# ---------------------------------------------------------------- debug view

def rounds_view(result: GenerationResult, prompt_ids: list[int], tokenizer, pieces: list[dict] | None = None) -> Text:
    """The output rebuilt round by round in the debug colours, each round after its γ as a dim
    superscript; ``pieces`` (:func:`repl.runs.round_pieces`) replace decoding with ``tokenizer``."""
    if pieces is None:
        pieces = round_pieces(tokenizer, prompt_ids, result.trace)
    text = Text()
    for rnd, piece in zip(result.trace, pieces):
        if rnd.gamma > 0:
            text.append(str(rnd.gamma).translate(SUPERSCRIPT), style=GAMMA_MARK)
        if "losers" in piece:
            # A tree round: the accepted path, then the candidates that lost where it stopped.
            for drafted in piece["drafted"][:rnd.accepted]:
                text.append(drafted, style=ACCEPTED)
            if piece["losers"]:
                text.append("{" + "|".join(piece["losers"]) + "}", style=LOSER)
        for i, drafted in enumerate(piece["drafted"] if "losers" not in piece else ()):
            text.append(drafted, style=ACCEPTED if i < rnd.accepted else REJECTED)
        if rnd.token is not None and piece.get("token") is not None:
            text.append(piece["token"], style=BONUS if rnd.bonus else TARGET)
    return text


def legend() -> Text:
    text = Text("debug colours: ")
    for label, style in (("accepted draft", ACCEPTED), ("rejected draft", REJECTED),
                         ("target token", TARGET), ("bonus token (all drafts accepted)", BONUS),
                         ("{tree candidates that lost}", LOSER)):
        text.append(label, style=style)
        text.append("  ")
    text.append("⁴", style=GAMMA_MARK)
    text.append(" a round's γ")
    return text


# ----------------------------------------------------------- comparison table

# The comparison's columns (header, justification): comparison_cells fills them.
COMPARISON_COLUMNS = (("strategy", "left"), ("tokens", "right"), ("tokens/s", "right"), ("TTFT ms", "right"),
                      ("decode tok/s", "right"), ("speedup", "right"),
                      ("tok/call", "right"), ("call cost", "right"), ("predicted", "right"), ("best γ", "right"),
                      ("d/v/o %", "right"), ("identical", "left"))


# Columns a terminal too narrow for the whole table gets as caption sentences instead (the rest of
# the table whole): first the two that split a speedup (tok/call over call cost), then the decode
# figures (time to first token, decode-only tokens/s).
SPLIT_COLUMNS = ("tok/call", "call cost")
DECODE_COLUMNS = ("TTFT ms", "decode tok/s")
# The layouts tried, widest first: (columns dropped, decode headers stacked on two lines).
COMPARISON_LAYOUTS = (((), False), ((), True), (SPLIT_COLUMNS, False), (SPLIT_COLUMNS, True),
                      (SPLIT_COLUMNS + DECODE_COLUMNS, False))


def comparison_table(prompt_run: PromptRun, width: int | None = None) -> Table:
    """Speedup over target AR per strategy, split into tokens per target call and call cost, beside
    TTFT, decode tokens/s, the prediction, the phase split and identity. ``width``: the terminal's
    columns; a table wider than that tries the narrower ``COMPARISON_LAYOUTS`` in turn."""
    rows = [comparison_cells(prompt_run, run) for run in prompt_run.runs]
    for dropped, stacked in COMPARISON_LAYOUTS:
        table = _comparison(prompt_run, rows, dropped, stacked)
        if width is None or _natural_width(table) <= width:
            break
    return table


def _natural_width(table: Table) -> int:
    """The columns ``table`` takes when nothing wraps."""
    from rich.measure import Measurement

    console = Console(width=10_000, file=io.StringIO())
    return Measurement.get(console, console.options, table).maximum


def _comparison(prompt_run: PromptRun, rows: list[list[str]], dropped: tuple[str, ...],
                stacked: bool = False) -> Table:
    """The comparison without the ``dropped`` columns, whose numbers go to the caption;
    ``stacked``: the decode columns' headers on two lines (``TTFT`` over ``ms``)."""
    table = Table(title=Text("Comparison"), title_justify="left", show_edge=False, pad_edge=False,
                  collapse_padding=True)
    shown = [i for i, (header, _) in enumerate(COMPARISON_COLUMNS) if header not in dropped]
    for i in shown:
        header, justify = COMPARISON_COLUMNS[i]
        if stacked and header in DECODE_COLUMNS:
            header = header.replace(" ", "\n", 1)
        # headers may wrap on a narrow terminal; the cells themselves stay whole
        table.add_column(Text(header), justify=justify, overflow="fold",
                         min_width=11 if header == "strategy" else None)
    for run, cells in zip(prompt_run.runs, rows):
        table.add_row(*(Text(cells[i]) for i in shown), style=STRATEGY_COLOURS[run.key])
    split = ("tok/call (tokens per target call) over call cost (seconds per target call, drafting "
             "included, over target AR's)")
    if SPLIT_COLUMNS[0] in dropped:
        parts = [f"{run.label} {run.result.tokens_per_target_call:.2f} / {prompt_run.call_cost(run):.2f}x"
                 for run in prompt_run.runs if prompt_run.call_cost(run) is not None and run.key != "target"]
        split += f": {', '.join(parts)}" if parts else ""
    decode = ("TTFT = time to first token (the prefill and the first round); decode tok/s = the tokens "
              "after it over the seconds after it")
    if DECODE_COLUMNS[0] in dropped:
        at = [i for i, (header, _) in enumerate(COMPARISON_COLUMNS) if header in DECODE_COLUMNS]
        parts = [f"{run.label} {cells[at[0]]} ms / {cells[at[1]]}" for run, cells in zip(prompt_run.runs, rows)
                 if run.result is not None and cells[at[0]] != "-"]
        decode = ("time to first token (the prefill and the first round) / decode tok/s (the tokens after "
                  "it over the seconds after it)" + (f": {', '.join(parts)}" if parts else ": not recorded"))
    notes = [f"speedup = tokens/s over target AR's tokens/s = {split}", decode,
             "predicted, best γ: the speedup model (docs/why.md, /stats)",
             "d/v/o = share of the time spent drafting / verifying / other"]
    if prompt_run.baseline() is None:
        notes[0] = "speedup and identity need a complete target AR run (/target)"
    elif not prompt_run.greedy:
        notes.append("identity is checked under greedy only: sampled outputs differ by design")
    else:
        notes.append("identical: token ids compared with target AR (tie@N: they part at token N on a near-tie, "
                     "two tokens the two computations' rounding ranks differently; no@N: unexplained there; "
                     "/stats says why)")
        if prompt_run.target_dtype in HALF_DTYPES and any(
                prompt_run.divergence(run)[0] is False for run in prompt_run.runs):
            notes.append(half_precision_reason(prompt_run.target_dtype))
    table.caption = Text("; ".join(notes))
    table.caption_justify = "left"
    return table


def busy_line(prompt_run: PromptRun) -> str | None:
    """One warning line when other processes took more than ``BUSY_CORES`` over the prompt or, failing
    that, the busiest strategy's run; None on a quiet machine or where nothing was measured."""
    load = prompt_run.machine_load
    if not load:
        return None
    cores = int(load.get("cores") or 0)
    line = busy_warning(load.get("other_load"), cores, "this prompt's runs")
    measured = [run for run in prompt_run.runs if run.other_load is not None]
    if line is None and measured:
        busiest = max(measured, key=lambda run: run.other_load)
        line = busy_warning(busiest.other_load, cores, f"{busiest.label}'s run")
    return line


def comparison_cells(prompt_run: PromptRun, run: StrategyRun) -> list[str]:
    """One run's row of the comparison, as plain strings in ``COMPARISON_COLUMNS`` order
    (the terminal table and the HTML report both show it)."""
    if run.result is None:
        return [run.label, "-", "-", "-", "-", "n/a", "-", "-", "-", "-", "-", "n/a"]
    r = run.result
    why = prompt_run.why(run)
    if why is None:
        predicted, best = "-", "-"
    else:
        predicted = ratio_text(why.predicted) + ("" if why.predicted is None else est_note(why) + interval_note(why))
        best = "-" if why.no_gamma else "n/a" if why.best_gamma is None else str(why.best_gamma)
    return [
        run.label + (" (interrupted)" if r.interrupted else ""),
        str(len(r.tokens)),
        f"{r.tokens_per_second:.1f}",
        first_token_ms(r),
        decode_rate_cell(r),
        ratio_text(prompt_run.speedup(run)),
        f"{r.tokens_per_target_call:.2f}" if r.target_calls else "-",
        ratio_text(prompt_run.call_cost(run)),
        predicted,
        best,
        phase_split(r),
        _identity_cell(prompt_run, run),
    ]


def first_token_ms(result: GenerationResult) -> str:
    """Time to first token in ms (``GenerationResult.first_token_s``), or ``-`` when unknown."""
    return "-" if result.first_token_s is None else f"{result.first_token_s * 1000:.0f}"


def decode_rate_cell(result: GenerationResult) -> str:
    """Decode-only tokens/s (``GenerationResult.decode_tokens_per_second``), or ``-`` when unknown."""
    rate = result.decode_tokens_per_second
    return "-" if rate is None else f"{rate:.1f}"


def _identity_cell(prompt_run: PromptRun, run: StrategyRun) -> str:
    """``yes``, ``tie@7`` (a near-tie at token 7), ``no@7`` (unexplained there), ``baseline``
    (the target AR row) or ``n/a``."""
    if run.key == "target" and run.usable:
        return "baseline"
    identical, index = prompt_run.divergence(run)
    if identical is None:
        return "n/a"
    if identical:
        return "yes"
    explained = prompt_run.report(run).divergence
    return explained.short if explained is not None else f"no@{index}"


def divergence_text(prompt_run: PromptRun, run: StrategyRun) -> str | None:
    """/stats' line on where ``run`` parts from target AR and why (``analysis.divergence``), or
    None when it does not (or was not compared)."""
    d = prompt_run.report(run).divergence
    if d is None:
        return None
    line = f"differs from target AR at token {d.position} (AR {d.ar_token}, this run {d.token}): "
    if d.verdict is None:
        return line + f"no verdict: {d.note}"
    logits = " · ".join(f"{name} {_logit_pair(values, floor)}" for name, values, floor in
                        (("target AR's step", d.ar_logits, d.ar_floor), ("this run's verify", d.logits, d.floor)))
    return line + f"{d.verdict}; logits of (AR's, this run's) token: {logits}; {d.note}"


def _logit_pair(values, floor) -> str:
    """``(11.125, 11.0625)``, a logit outside the recorded top-k shown as ``<floor``."""
    return "(" + ", ".join(f"<{floor:.6g}" if v is None else f"{v:.6g}" for v in values) + ")"


# ------------------------------------------------------------------- /stats

def ms_text(seconds: float) -> str:
    """``12.3 ms``."""
    return f"{seconds * 1000:.1f} ms"


def rollback_text(rollback: dict) -> str:
    """``target crop: restores 0, refed_tokens 0, 0.0 ms`` per model, every count shown."""
    parts = []
    for model, stats in (rollback or {}).items():
        if not isinstance(stats, dict):
            continue
        counts = ", ".join(f"{k} {v}" for k, v in stats.items()
                           if k not in ("method", "seconds", "path", "reason", "step"))
        lean = " (lean step)" if stats.get("step") == "lean" else ""
        parts.append(f"{model} {stats.get('method', '?')}{lean}: {counts + ', ' if counts else ''}"
                     f"{ms_text(float(stats.get('seconds', 0.0) or 0.0))}")
    return "; ".join(parts) or "not recorded"


def network_text(result: GenerationResult) -> str | None:
    """``server: 29 requests (1.21 per token), 1290 ms: compute 1077 ms, round trip 213 ms (7.3 ms a request)``
    for a served target (remote.transport.RequestTimes); None for a local one."""
    net = getattr(result, "network", None) or {}
    requests = int(net.get("requests", 0) or 0)
    if not requests:
        return None
    tokens = len(result.tokens)
    per_token = f" ({requests / tokens:.2f} per token)" if tokens else ""
    retries = int(net.get("retries", 0) or 0)
    return (f"server: {requests} requests{per_token}, {ms_text(float(net['request_s']))}: compute "
            f"{ms_text(float(net['server_s']))}, round trip {ms_text(float(net['round_trip_s']))} "
            f"({float(net['round_trip_per_request_ms']):.1f} ms a request)"
            + (f", {retries} retried" if retries else ""))


def path_text(rollback: dict) -> str:
    """``cache path: target cached · drafter stepwise (why)``: how each model was fed (kvcache.probe)."""
    parts = []
    for model, stats in (rollback or {}).items():
        if isinstance(stats, dict) and stats.get("path"):
            reason = stats.get("reason") or ""
            parts.append(f"{model} {stats['path']}" + (f" ({reason})" if reason and stats["path"] != "cached" else ""))
    return "cache path: " + (" · ".join(parts) or "not recorded")


def compile_text(result: GenerationResult, *, detail: bool = False) -> str | None:
    """``compile: graphs (drafter graphs)`` or ``compile: off (asked static; fell back)``; None for a
    served target. ``detail`` (/stats) adds widths, captures, their seconds, recompiles and why the target or the drafter fell back."""
    compiled = getattr(result, "compile", None)     # None in a trace written before the field
    if not compiled:
        return None
    path, requested = compiled.get("path", "?"), compiled.get("requested", "?")
    text = f"compile: {path}"
    notes = []
    if path != requested:
        notes.append(f"asked {requested}; fell back")
    if compiled.get("drafter_path"):
        notes.append(f"drafter {compiled['drafter_path']}")
    if notes:
        text += f" ({'; '.join(notes)})"
    if detail and compiled.get("captures"):
        widths = ", ".join(str(w) for w in compiled.get("widths") or [])
        buckets = ", ".join(str(b) for b in compiled.get("buckets") or [])
        text += (f" · widths {widths or '-'} in buckets {buckets or '-'} · {compiled['captures']} captures in "
                 f"{float(compiled.get('capture_s') or 0.0):.2f} s (not in the run's time) · "
                 f"{compiled.get('recompiles', 0)} recompiles")
    if detail and compiled.get("reason"):
        text += f" · why: {compiled['reason']}"
    if detail and compiled.get("drafter_reason"):
        text += f" · drafter: {compiled['drafter_reason']}"
    return text


# ------------------------------------------------------------------- replay

def prompt_line(prompt_run: PromptRun) -> str:
    """``prompt: 12 tokens (chat template) · greedy · up to 64 new tokens · seed 42 · gamma 4 constant``."""
    s = settings_from_dict(prompt_run.settings)
    chat = "chat template" if s.chat else "raw text"
    return (f"prompt: {len(prompt_run.prompt_ids)} tokens ({chat}) · {s.processor.describe()} · "
            f"up to {s.length} new tokens · seed {s.seed} · gamma {s.gamma} {s.gamma_policy_text()} · "
            f"verify {s.verify}")


def environment_lines(env: dict) -> list[str]:
    """The models, device and versions a trace was recorded with."""
    versions = env.get("versions") or {}
    lines = [f"target:  {env.get('target', '?')}", f"drafter: {env.get('drafter', '?')}",
             f"device: {env.get('device', '?')} · context: {env.get('context_length', '?')} tokens"]
    if versions:
        lines.append(" · ".join(f"{k} {v}" for k, v in versions.items()))
    return lines

