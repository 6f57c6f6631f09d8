"""Compare decoding strategies on your prompts: speculative decoding, NASD,
target autoregressive and drafter autoregressive.

    python infer.py [flags]          interactive session (type /help)
    python infer.py --prompt "..."   scripted: run the prompts and exit
    python infer.py --replay FILE    show a saved trace again (no torch, no model)

Only the flag table is imported before the flags are parsed: ``--help`` never
loads torch or a model.
"""

from __future__ import annotations

import argparse
import os
import sys

from repl.commands import CommandError, add_flags, apply_flags
from repl.settings import Settings
from analysis.whatif import whatif_argument

DESCRIPTION = (
    "Run the same prompt, with the same seed, through speculative decoding (a drafter model), "
    "NASD (n-gram assisted speculative decoding), target autoregressive and drafter "
    "autoregressive decoding, and compare speed, acceptance and output."
)
EPILOG = (
    "Every session setting is also a slash command inside the session (/help lists them). "
    "Scripted mode starts when --prompt or --prompts-file is given, or when stdin is not a "
    "terminal; it runs the prompts and exits."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infer.py", description=DESCRIPTION, epilog=EPILOG)
    models = parser.add_argument_group("models")
    models.add_argument("--target", metavar="NAME_OR_DIR",
                        help="target model: a hub name or a local directory (default: the offline SmolLM2 pair)")
    models.add_argument("--drafter", metavar="NAME_OR_DIR",
                        help="drafter model sharing the target's tokenizer (needed with --target), or a "
                             "self-drafter made from the target: self:bf16, self:fp16, self:int8, "
                             "self:skip=L1,L2,... or self:skip=auto, or mtp: the target's own multi-token-"
                             "prediction layers (DeepSeek-V3, GLM-4.5, ...; transformers >= 5.24), or "
                             "eagle3:PATH: an EAGLE-3 head (a directory or hub id in the published layout), or "
                             "gemma4-assistant:DIR: a Gemma 4 assistant checkpoint drafting for a Gemma 4 target "
                             "(transformers >= 5.24) (default "
                             "with the default target: the self-drafter measured fastest on this machine)")
    models.add_argument("--target-server", metavar="URL",
                        help="the target is the model behind a serving engine at URL (llama.cpp's, vLLM's or "
                             "SGLang's server: http://127.0.0.1:8080); the drafter and the tokenizer load here (default drafter: "
                             "the offline model); see docs/server.md")
    models.add_argument("--server-kind", metavar="KIND",
                        help="the engine behind --target-server: llamacpp, vllm or sglang (default: detected)")
    models.add_argument("--server-probs", metavar="N", type=int, default=20,
                        help="log-probabilities asked for at each position (default 20; the server's whole "
                             "vocabulary makes every sampler exact, slowly)")
    models.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
    models.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (default: auto)")
    models.add_argument("--quantize", metavar="MODE", help="quantise the target's weights (e.g. int8, int4)")
    models.add_argument("--drafter-quantize", metavar="MODE", help="quantise the drafter's weights")
    models.add_argument("--device-map", metavar="MAP", help="a transformers device map for large models (e.g. auto)")
    models.add_argument("--offline", action="store_true", help="never contact the model hub")
    models.add_argument("--cache-dir", metavar="DIR", help="where models are cached (sets SPECDEC_CACHE_DIR)")
    add_flags(parser)
    script = parser.add_argument_group("scripted mode")
    script.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt to run (repeatable)")
    script.add_argument("--prompts-file", metavar="FILE",
                        help="plain lines (/commands allowed) or JSON lines with 'prompt' or Spec-Bench 'turns'")
    script.add_argument("--json", action="store_true",
                        help="one JSON object per prompt on stdout; messages go to stderr")
    script.add_argument("--selftest", action="store_true",
                        help="check that speculative decoding and NASD keep the target's output on the "
                             "loaded pair (greedy, cache on and off, and sampling; token trees with --tree N); "
                             "one line per check, exit status 1 when any fails")
    script.add_argument("--advise", action="store_true",
                        help="advise which way of drafting this pair should use here for the scripted prompts "
                             "(every drafter replayed from target AR's greedy output, ranked by predicted "
                             "speedup, the best 3 confirmed by real runs); with --json one JSON object "
                             "(docs/advisor.md)")
    script.add_argument("--whatif", type=whatif_argument, metavar="batch|context|machine:NAME",
                        help="with --advise: project the replayed methods, with where speculation stops "
                             "paying: over batch sizes 1 to 32 by forwards timed here by shape (batch: about two "
                             "minutes more on a 2-core CPU) or on a card's roofline (machine:NAME: H200, H100, "
                             "A100, L40S, RTX3090), or at batch 1 over context lengths up to the model's window, "
                             "timed here (context; docs/why.md)")
    script.add_argument("--costs", metavar="FILE",
                        help="the advisor's forward costs read from FILE (measured elsewhere: a --json "
                             "advice's 'costs' object or bench.py --advise's costs.json) instead of measured here")
    traces = parser.add_argument_group("traces")
    traces.add_argument("--trace-out", metavar="FILE",
                        help="write every prompt's trace (settings, models, rounds, metrics) to FILE as JSON")
    traces.add_argument("--replay", metavar="FILE",
                        help="show a trace file again: panels, debug view, comparison, /stats and the "
                             "inspector; loads neither torch nor a model")
    traces.add_argument("--html", metavar="OUT.html",
                        help="with --replay: write the trace as one self-contained HTML report instead "
                             "(in a session: /save NAME.html); with --advise: the advice and its --whatif "
                             "projection, charted, as one page")
    return parser


def replay(path: str, html: str | None = None) -> int:
    """``--replay FILE [--html OUT]``: render a trace file, or write it as an
    HTML report; torch is never imported."""
    from repl.render import make_console
    from repl.replay import show_trace
    from repl.report import write_report
    from repl.trace import TraceError, read_trace

    console = make_console()
    try:
        trace = read_trace(path)
        if html is not None:
            write_report(html, trace.prompts, trace.environment, created=trace.created)
            console.print(f"report written to {html} (one self-contained page)")
            return 0
    except TraceError as e:
        make_console(stderr=True).print(str(e), style="bold red")
        return 2
    show_trace(trace, console)
    return 0


def pipe_notice(as_json: bool) -> str | None:
    """One line when a person types at a terminal but stdout is a pipe or a file (rich then draws
    at a fixed width without colours), None otherwise; --json means the pipe is wanted."""
    if as_json or not sys.stdin.isatty() or sys.stdout.isatty():
        return None
    from repl.render import make_console

    console = make_console()
    colours = "no colours" if console.color_system is None else "colours forced on"
    return (f"stdout is not a terminal: {console.width} columns, {colours}; "
            "set COLUMNS for another width, or use --json")


def _load(args, console):
    """The model pair, or exit with the loader's one-line message."""
    if args.cache_dir:
        os.environ["SPECDEC_CACHE_DIR"] = args.cache_dir
    from utils.models import ModelLoadError, set_offline

    set_offline(args.offline)  # before transformers is imported
    # Imported here, not at the top: the engine imports torch and transformers, which
    # infer.py --help and --replay never need (start-up time), and only after set_offline.
    from engine import load_pair
    from utils.progress import loading_status

    try:
        with loading_status(console) as progress:
            if args.target_server:
                from engine.served_pair import load_served_pair

                return load_served_pair(args.target_server, args.server_kind, args.drafter,
                                        n_probs=args.server_probs, device=args.device, dtype=args.dtype,
                                        drafter_quantize=args.drafter_quantize, progress=progress,
                                        cache_dir=args.cache_dir)
            return load_pair(
                args.target, args.drafter, device=args.device, dtype=args.dtype,
                quantize=args.quantize, drafter_quantize=args.drafter_quantize,
                device_map=args.device_map, progress=progress, cache_dir=args.cache_dir,
            )
    except ModelLoadError as e:
        console.print(f"could not load the models: {e}", style="bold red")
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.html and not (args.replay or args.advise):
        parser.error("--html needs --replay FILE or --advise (in a session, /save NAME.html writes the report)")
    if args.replay:
        return replay(args.replay, args.html)
    if args.target_server and args.target:
        parser.error("--target-server and --target both name the target: give one")
    if (args.server_kind or args.server_probs != 20) and not args.target_server:
        parser.error("--server-kind and --server-probs need --target-server URL")
    settings = Settings()
    try:
        notices = apply_flags(args, settings)
    except CommandError as e:
        parser.error(str(e))
    scripted = not args.selftest and bool(args.prompt or args.prompts_file or args.json or args.advise
                                          or not sys.stdin.isatty())
    if args.advise and (args.selftest or not (args.prompt or args.prompts_file or not sys.stdin.isatty())):
        parser.error("--advise advises on scripted prompts: give --prompt TEXT or --prompts-file FILE "
                     "(or pipe them on stdin), without --selftest")
    if args.whatif and not args.advise:
        parser.error("--whatif projects the advice: give it with --advise")
    costs = None
    if args.costs:
        from advisor.costs import CostsError, CostTable

        try:
            costs = CostTable.load(args.costs)
        except CostsError as e:
            parser.error(str(e))
    if args.json or not sys.stdout.isatty():
        # Live drawing needs a terminal, and stdout carries JSON or a pipe's text.
        if args.cmd_live:
            notices.append("--live is off: it needs a terminal on stdout and no --json")
        settings.live = False

    from repl.render import make_console
    from repl.scripted import ScriptError, collect

    # Scripted output goes to stdout only as results (or JSON); messages to stderr.
    messages = make_console(stderr=scripted)
    entries = []
    if scripted:
        try:
            entries = collect(args.prompt, args.prompts_file, sys.stdin)
        except ScriptError as e:
            parser.error(str(e))
    for path, what in ((args.trace_out, "trace"), (args.html, "report")):
        if path:
            from repl.trace import TraceError, check_writable

            try:
                check_writable(path, what)
            except TraceError as e:
                parser.error(str(e))
    for notice in notices:
        messages.print(notice, style="yellow")
    piped = pipe_notice(args.json)
    if piped is not None:
        make_console(stderr=True).print(piped, style="yellow", soft_wrap=True)

    pair = _load(args, messages)
    from kvcache.static import default_compile
    from repl.runner import Runner
    from repl.session import Session, interactive

    if args.cmd_compile is None:        # the target device's path (graphs on CUDA, off on a CPU)
        settings.compile = default_compile(pair.device)
    for line in pair.banner_lines():
        messages.print(line, style="bold")
    messages.print(f"device: {pair.device} · context: {pair.context_length or 'unknown'} tokens · "
                   f"compile: {settings.compile}", style="bold")
    if args.selftest:
        from checks.selftest import selftest_exit_code

        return selftest_exit_code(pair, tree=settings.tree, tree_branch=settings.tree_branch)
    runner = Runner(pair, notify=lambda m: messages.print(m, style="yellow"))
    if settings.drafter and pair.drafter is not None:
        from engine import decodes_alone_reason

        reason = decodes_alone_reason(pair.drafter)
        if reason is not None:          # the MTP layers, an EAGLE-3 head, a Gemma 4 assistant
            settings.drafter = False
            messages.print(f"drafter AR is off: {reason}", style="yellow")
    try:
        with messages.status("Warming up both models…"):
            runner.warm_up(settings.compile)
    except ValueError as e:   # a served target that fails its first requests (remote.transport.ServerError)
        messages.print(f"could not warm up: {e}", style="bold red")
        return 1
    if scripted:
        from repl.scripted import run_script

        output = make_console(stderr=args.json)
        session = Session(runner, settings, output if not args.json else messages, trace_out=args.trace_out,
                          advisor_costs=costs)
        if args.advise:
            from repl.advice import advise_script

            return advise_script(session, entries, as_json=args.json, stdout=sys.stdout, whatif=args.whatif,
                                 html=args.html)
        return run_script(session, entries, as_json=args.json, stdout=sys.stdout)
    return interactive(Session(runner, settings, messages, trace_out=args.trace_out, advisor_costs=costs))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
