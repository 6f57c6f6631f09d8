"""One benchmark from parsed flags to files: load, encode, run, summarise, report, write."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from dataclasses import asdict

import torch
from rich.console import Console
from rich.text import Text

from bench.advise import advice_conflict, run_advice
from bench.aggregate import judge_records, summarize
from bench.chart import speedup_chart
from bench.executor import Executor, RunSettings
from bench.expect import check_expectations, undecided, unknown_names
from bench.margin import expectation_level
from bench.marks import busy_line, busy_runs, coverage, coverage_dict, coverage_line
from bench.progress import run_progress
from bench.ceiling import ceiling_lines, copy_ceilings
from bench.meta import environment, header_lines
from bench.prompts import PromptFileError, conversation_ids, load_conversations, load_prompts
from bench.report import markdown_report, print_report
from bench.settings import BenchSettings
from bench.runner import (
    conversation_sessions, encode_prompts, iter_session_runs, run_count, single_sessions, split_fitting_sessions,
    task_sessions,
)
from bench.peers import static_peer_refusal
from bench.variants import plan_variants
from bench.writers import report_dict, write_csv, write_json
from engine import EngineState, decodes_alone
from kvcache.static import default_compile
from engine.kinds import build_variant, kind_of_module
from engine.loading import resolve_variant
from utils.errors import ModelLoadError
from utils.machine_load import load_record, read_load


def model_peer(drafter) -> str | None:
    """transformers' peer of speculative decoding with ``drafter``, as its kind says (``DrafterKind.hf_peer``)."""
    kind = kind_of_module(drafter)
    return kind.hf_peer if kind is not None else "hf_assisted"


def _consoles():
    """stdout for the report (wide when it is not a terminal, so files keep whole rows)."""
    out = Console(markup=False)
    if not out.is_terminal:
        out = Console(width=200, markup=False)
    return out, Console(stderr=True, markup=False)   # no markup: names and paths carry brackets


def _error(err, message: str) -> None:
    """``error: MESSAGE`` on one line (the terminal wraps it, not rich), the word in red (the
    console takes no markup)."""
    err.print(Text.assemble(("error:", "red"), " ", str(message)), highlight=False, soft_wrap=True)


def _load(args, loader, err):
    try:
        with err.status("loading models..."):
            return loader(args)
    except ModelLoadError as exc:
        _error(err, exc)
        return None


def _flag_conflict(args) -> str | None:
    """One line when the session flags do not go together, else None."""
    if args.multi_turn and args.session_size:
        return "--multi-turn and --session-size do not go together: a conversation is already a session"
    if args.multi_turn and args.turn != 1:
        return "--multi-turn runs every turn: leave --turn out"
    if args.until_decided is not None and not args.expect:
        return "--until-decided needs an --expect to settle"
    if args.until_decided is not None and args.until_decided < max(args.repeats, 2):
        return f"--until-decided {args.until_decided}: at least 2 and at least --repeats ({args.repeats})"
    return None


def _out_problem(out) -> str | None:
    """Why the output folder cannot take the files (one line), or None; checked before any run,
    so a long benchmark does not end on a traceback with nothing written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as exc:
        return f"cannot write to --out {out}: {exc.strerror or exc}"
    return None


def _arctic_ready(args) -> str | None:
    """Why the arctic_suffix peer cannot run (one line), or None when it can (or was not asked for)."""
    if not args.arctic_suffix:
        return None
    if "ngram" not in args.strategies:
        return "the arctic_suffix peer runs beside NASD: add ngram to --strategies"
    from bench.arctic import ArcticUnavailable, cache_class

    try:
        cache_class()
    except ArcticUnavailable as exc:
        return str(exc)
    return None


def _read_prompts(args):
    """The prompts (one Prompt each, or a tuple per conversation with --multi-turn)."""
    if args.multi_turn:
        return load_conversations(args.prompts, categories=args.categories, limit=args.limit)
    return load_prompts(args.prompts, categories=args.categories, limit=args.limit, turn=args.turn)


def build_sessions(args, prompts, models):
    """The sessions to run and the follow-up encoder of a conversation's later turns (or None)."""
    tokenizer = models.tokenizer
    if args.multi_turn:
        def follow_up(turns, answers):
            return conversation_ids(tokenizer, turns, answers, chat=args.chat)
        return conversation_sessions(prompts, lambda text: follow_up([text], [])), follow_up
    encoded = encode_prompts(prompts, tokenizer, chat=args.chat)
    if args.session_size:
        return task_sessions(encoded, args.session_size), None
    return single_sessions(encoded), None


def run_session(args: BenchSettings, loader, settings_dict) -> int:
    """The benchmark of ``args``: 0, 1 (no run finished, files unwritable, a run failed), 2 (refused
    before any run) or 130 (interrupted)."""
    out, err = _consoles()
    problem = _flag_conflict(args) or _out_problem(args.out) or _arctic_ready(args)
    if problem:
        _error(err, problem)
        return 2
    try:
        prompts = _read_prompts(args)
    except PromptFileError as exc:
        _error(err, exc)
        return 2
    if not prompts:
        _error(err, "no prompts left after --categories/--limit/--turn"
               + (" (--multi-turn keeps items with two turns or more)" if args.multi_turn else ""))
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if (args.advise or args.whatif) and (problem := advice_conflict(args)):
        _error(err, problem)
        return 2
    models = _load(args, loader, err)
    if models is None:
        return 2
    if args.advise:         # the advisor in place of the runs
        return run_advice(args, prompts, models, out, err)

    sessions, follow_up = build_sessions(args, prompts, models)
    sessions, skipped = split_fitting_sessions(sessions, length=args.length, context_length=models.context_length,
                                               follow_up=follow_up)
    for s in skipped:
        err.print(f"skipping {s.prompt_id}: {s.reason}", style="yellow", highlight=False)
    state = EngineState()  # the executor's: the self-drafters built here are the ones it runs
    try:
        self_drafters, notes = prepare_self_drafters(models, args.self_drafters, err, state)
    except ValueError as exc:  # a spec that does not apply to the target (one line)
        _error(err, exc)
        return 2
    args = args.but(self_drafters=self_drafters)
    if "drafter" in args.strategies and not decodes_alone(models.drafter):
        err.print("leaving out drafter AR: this drafter drafts from the target's state and cannot decode alone",
                  style="yellow", highlight=False)
        args = args.but(strategies=[s for s in args.strategies if s != "drafter"])
    if args.compile is None:            # the target device's path: graphs on CUDA, off on a CPU
        args = args.but(compile=default_compile(models.device))
    static, refused = static_peers(args, models)
    for line in refused:
        err.print(line, style="yellow", highlight=False)
    notes += refused
    variants = plan_variants(args.strategies, args.gamma, peers=args.peers, policies=args.policies,
                             trees=args.trees, self_drafters=self_drafters, verifies=args.verify,
                             hybrids=args.hybrid, model_peer=model_peer(models.drafter),
                             storages=args.ngram_storage, arctic=args.arctic_suffix, lookaheads=args.lookahead,
                             static_peers=static)
    for line in unknown_names(args.expect, [v.name for v in variants], [s.category for s in sessions]):
        err.print(line, style="yellow", highlight=False)
    executor = Executor(models, RunSettings(
        spec=args.processor, length=args.length, seed=args.seed,
        ngram_storage=args.ngram_storage[0], ngram_n=args.ngram_n, filler_top_k=args.top_k_filler,
        suffix_pattern=args.suffix_pattern,
        assisted_confidence=args.assisted_confidence, max_matching_ngram_size=args.lookup_ngram,
        tree_branch=args.tree_branch,
        tree_sample=args.tree_sample,
        uag=args.uag, compile=args.compile,
    ), state=state)
    start = read_load()
    records, planned, stopped = _run_all(executor, sessions, follow_up, variants, args, err)
    load = load_record(start, read_load())
    if args.processor.is_greedy:           # differences from target AR judged while the target is here
        from analysis.reference import referee_for
        judge_records(records, referee_for(models.target))
    executor.close()
    if not records:
        err.print("no run finished", style="red")
        return 1

    settings = settings_dict(args, sum(len(s.steps) for s in sessions))
    settings.update(sessions=len(sessions) if (args.multi_turn or args.session_size) else None)
    settings.update(variants=[v.name for v in variants], interrupted=stopped is not None,
                    planned_repeats=args.repeats, repeats=len({r.repeat for r in records}))
    env = environment(models)
    greedy = args.processor.is_greedy
    rows = summarize(records, greedy=greedy, compile=args.compile)
    goals = check_expectations(records, args.expect, expectation_level(args.repeats, args.until_decided))
    ceilings = copy_ceilings(records, sessions, args.length, follow_up) if greedy else {}
    marks = _marks(records, sessions, variants, planned, stopped, load, err)
    header = (header_lines(env, settings) + marks["lines"] + notes + fallback_lines(records) + compile_lines(records)
              + ceiling_lines(ceilings))
    word = "turn" if args.multi_turn else "prompt"
    print_report(out, header, rows, goals, word)
    try:
        _write_files(args, env, settings, rows, goals, records, skipped, header, err, word, ceilings, marks)
    except OSError as exc:   # the folder was writable at the start; a full disk, say
        _error(err, f"could not write the files to {args.out}: {exc.strerror or exc} (the tables above are the run's)")
        return 1
    return {None: 0, "interrupted": 130}.get(stopped, 1)


def _marks(records, sessions, variants, planned: int, stopped: str | None, load: dict, err) -> dict:
    """What the figures stand on: the header's lines (a stopped run's coverage, a busy machine's
    warning, said once on the terminal too) and bench.json's ``interrupted`` and ``load``."""
    lines, interrupted = [], None
    if stopped is not None:
        prompts = [step.prompt.id for s in sessions for step in s.steps]
        covered = coverage(records, prompts, len(variants), planned)
        interrupted = coverage_dict(covered)
        lines.append(coverage_line(covered))
    if (warning := busy_line(records)) is not None:
        err.print(warning, style="yellow", highlight=False)
        lines.append(warning)
    load.update(busy_runs=busy_runs(records), runs=len(records))
    return {"lines": lines, "interrupted": interrupted, "load": load}


def prepare_self_drafters(models, specs: list[str], err, state: EngineState) -> tuple[list[str], list[str]]:
    """Build each self-drafter of ``--self-drafters`` once, before any clock starts (kept in ``state``),
    ``self:skip=auto`` resolved by the layer search here. Returns the resolved labels and the search's
    lines for the header; ``ValueError`` (one line) where a spec does not apply to the target."""
    labels, notes = [], []
    for text in specs:
        label, lines = resolve_variant(models, text, say=lambda message: err.print(message, highlight=False))
        if label is None:  # nothing to run (the layer search kept every layer)
            notes.append(f"{text}: {lines[0]}")
            err.print(notes[-1], style="yellow", highlight=False)
            continue
        with err.status(f"building {label}..."):
            build_variant(models, label, state)
        notes += [f"{text}: {line}" for line in lines]
        if label not in labels:
            labels.append(label)
    return labels, notes


def _run_all(executor, sessions, follow_up, variants, args, err):
    """Every run, with a progress bar; Ctrl-C or a failed run stops early, keeping what finished.
    Returns (records, timed runs planned, None or ``interrupted`` / ``failed``)."""
    records = []
    steps = sum(len(s.steps) for s in sessions)
    total = run_count(steps, len(variants), repeats=args.repeats, warmup=args.warmup,
                      first_session=len(sessions[0].steps) if sessions else 0)
    planned = [total]
    timed = [steps * len(variants) * args.repeats]
    current = ["the warm-up"]
    with run_progress(err, total) as progress:

        def run(*a, **k):
            record = executor.run(*a, **k)
            progress.finished(record)
            return record

        def on_step(text):
            current[0] = text
            progress.describe(text)

        def more(done: int) -> bool:
            """Another repeat while --until-decided allows one and an --expect is unsettled."""
            if args.until_decided is None or done >= args.until_decided:
                return False
            level = expectation_level(args.repeats, args.until_decided)
            if not undecided(check_expectations(records, args.expect, level)):
                return False
            planned[0] += steps * len(variants)
            timed[0] += steps * len(variants)
            progress.grow(planned[0])
            return True

        try:
            alone = not (args.multi_turn or args.session_size)
            for record in iter_session_runs(run, sessions, variants, repeats=args.repeats, warmup=args.warmup,
                                            follow_up=follow_up, alone=alone, on_step=on_step, more=more):
                records.append(record)
        except KeyboardInterrupt:
            err.print(f"interrupted: reporting the {len(records)} runs that finished", style="yellow")
            return records, timed[0], "interrupted"
        except Exception as exc:   # one failed run (out of memory, say) does not lose the others
            _error(err, f"{current[0]} failed ({type(exc).__name__}: {exc}); "
                        f"reporting the {len(records)} runs that finished")
            return records, timed[0], "failed"
    return records, timed[0], None


def static_peers(args, models) -> tuple[set[str], list[str]]:
    """With --peers: the transformers decoders that also run on a static cache beside their eager
    rows, and one line for each one left out and why (``bench.peers.static_peer_refusal``)."""
    if not args.peers:
        return set(), []
    wanted = {"target": "hf_generate", "speculative": "hf_assisted", "ngram": "hf_prompt_lookup"}
    static, lines = set(), []
    for strategy, peer in wanted.items():
        if strategy not in args.strategies and strategy != "target":
            continue
        reason = static_peer_refusal(peer, models.target, models.drafter)
        if reason is None:
            static.add(peer)
        else:
            lines.append(f"{peer}+static left out: {reason}")
    return static, lines


def compile_lines(records) -> list[str]:
    """One line per variant whose compile path fell back, saying why (the first run's reason)."""
    why: dict[str, str] = {}
    for r in records:
        compiled = r.compile or {}
        if compiled.get("reason") and r.variant not in why:
            why[r.variant] = f"compile {compiled['requested']} ran {compiled['path']}: {compiled['reason']}"
    return [f"{variant}: {line}" for variant, line in why.items()]


def fallback_lines(records) -> list[str]:
    """One line per tree variant that verified chains instead, saying why."""
    why = {r.variant: r.tree_fallback for r in records if r.tree_fallback}
    return [f"{variant}: {line}" for variant, line in why.items()]


def _write_files(args, env, settings, rows, goals, records, skipped, header, err, word, ceilings, marks) -> None:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    extra = {"interrupted": marks["interrupted"], "load": marks["load"]}
    paths = [
        write_json(out / "bench.json", report_dict(env, settings, rows, goals, records, skipped, ceilings, extra)),
        write_csv(out / "summary.csv", [asdict(r) for r in rows]),
        write_csv(out / "runs.csv", [r.row() for r in records]),
    ]
    md = out / "summary.md"
    md.write_text(markdown_report(header, rows, goals, word), encoding="utf-8")
    paths.append(md)
    if args.chart:
        with contextlib.suppress(ImportError):
            title = f"{env['target']} · {settings['processor']} · {args.length} tokens"
            if marks["interrupted"] is not None:
                title += f" · interrupted: {marks['interrupted']['runs']} of {marks['interrupted']['planned']} runs"
            paths.append(speedup_chart(rows, out / "speedup_vs_gamma.png", title=title))
    err.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)
    sys.stderr.flush()
