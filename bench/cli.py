"""``python bench.py``: flags in, tables on the terminal, JSON, CSV, Markdown and a chart out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from advisor import CONFIRM
from analysis.whatif import whatif_argument
from bench.expect import parse_expectation
from bench.processors import parse_processor
from bench.variants import DEFAULT_LOOKAHEAD, DEFAULT_POLICIES, DEFAULT_STRATEGIES, OURS
from bench.settings import BenchSettings
from engine import load_pair
from engine.kinds import variant_labels
from generation.gamma_policies import make_policy
from utils.defaults import DEFAULTS
from utils.method_name import FILL, STORAGE_NAMES
from utils.options import (
    GAMMA_RANGE, HYBRID_RANGE, LOOKAHEAD_GUESSES_RANGE, LOOKAHEAD_NGRAM_RANGE, LOOKAHEAD_WINDOW_RANGE, NGRAM_N_RANGE,
    NGRAM_STORAGES, SUFFIX_PATTERN_RANGE, UAG_METHODS, COMPILE_PATHS, OptionError, compile_path,
)

DEFAULT_POLICY_GAMMA = dict((name.split()[0], gamma) for name, gamma in DEFAULT_POLICIES)

DESCRIPTION = """\
Benchmark the decoding strategies (speculative, NASD, target and drafter
autoregressive) on a prompt set, with constant gammas and adaptive gamma
policies, optionally beside transformers' own decoders (--peers), and write a
table, the checks of any --expect, JSON, CSV and a speedup-vs-gamma chart.
See docs/benchmark.md.
"""


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 4 or 1,2,4,8, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"gammas must be integers >= 1, got {text!r}")
    return sorted(dict.fromkeys(values))


def _capped_list(what: str, high: int):
    """:func:`_int_list` with each value at most ``high`` (the REPL command's range)."""
    def convert(text: str) -> list[int]:
        values = _int_list(text)
        if max(values) > high:
            raise argparse.ArgumentTypeError(f"{what} is at most {high}, got {text!r}")
        return values

    return convert


_gamma_list = _capped_list("a gamma", GAMMA_RANGE[1])
_hybrid_list = _capped_list("a hybrid's L", HYBRID_RANGE[1])   # the REPL's /hybrid range, whose 0 is off


def _name_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _strategies(text: str) -> list[str]:
    names = _name_list(text)
    unknown = [n for n in names if n not in OURS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown strategy {unknown[0] if unknown else text!r} (choose from {','.join(OURS)})")
    return names


def parse_lookaheads(text: str) -> list[tuple[int, int, int]]:
    """``"5:3:5,7:4:7"`` -> [(W, N, G), ...], each once, in the REPL's ranges for W, N and G.
    ValueError with a one-line message for a bad item."""
    ranges = (("W", LOOKAHEAD_WINDOW_RANGE), ("N", LOOKAHEAD_NGRAM_RANGE), ("G", LOOKAHEAD_GUESSES_RANGE))
    out: list[tuple[int, int, int]] = []
    for item in _name_list(text):
        parts = item.split(":")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"lookahead shape {item!r}: write W:N:G, three integers, e.g. 5:3:5")
        shape = tuple(int(p) for p in parts)
        for value, (name, (low, high)) in zip(shape, ranges):
            if not low <= value <= high:
                raise ValueError(f"lookahead shape {item!r}: {name} must be {low}-{high}, got {value}")
        if shape not in out:
            out.append(shape)
    if not out:
        raise ValueError(f"no lookahead shape in {text!r}: write W:N:G, e.g. 5:3:5")
    return out


def parse_policies(text: str) -> list[tuple[str, int]]:
    """``"heuristic@4,confidence 0.4@20,model@16"`` -> [(policy name, gamma)], ``none`` -> []; without
    ``@G`` a policy's default gamma. ValueError with a one-line message for a bad item."""
    if text.strip().lower() == "none":
        return []
    out = []
    for item in _name_list(text):
        name, _, gamma_text = item.partition("@")
        kind = name.split()[0] if name.split() else name
        if kind == "constant":
            raise ValueError("constant gammas come from --gamma, not --policies")
        if gamma_text:
            try:
                gamma = int(gamma_text)
            except ValueError:
                raise ValueError(f"policy {item!r}: gamma {gamma_text!r} is not an integer") from None
        else:
            gamma = DEFAULT_POLICY_GAMMA.get(kind, 4)
        policy = make_policy(name, gamma)
        entry = (policy.name, gamma)
        if entry not in out:
            out.append(entry)
    return out


def _argument_type(parse, errors=ValueError):
    """``parse`` as an argparse type: the one-line message of its ``errors`` becomes argparse's."""
    def convert(text: str):
        try:
            return parse(text)
        except errors as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


_policies = _argument_type(parse_policies)
_lookaheads = _argument_type(parse_lookaheads)
_expectation = _argument_type(parse_expectation)
_processor = _argument_type(parse_processor)
_compile_path = _argument_type(lambda text: compile_path(text.strip()), OptionError)


def parse_self_drafters(text: str) -> list[str]:
    """``"self:bf16,self:skip=3,5,self:int8"`` -> their labels, in order, once each (a comma inside a
    ``self:skip=`` layer list continues it; ``engine.kinds.variant_labels``). ValueError for a bad spec."""
    return variant_labels(_name_list(text))


def _choices(text: str, known, what: str) -> list[str]:
    """``a,b``: words of ``known``, each once, in the order given; else one line naming ``what``."""
    out = []
    for word in (w.strip().lower() for w in text.split(",")):
        if word not in known:
            raise argparse.ArgumentTypeError(f"unknown {what} {word!r}; choose from {', '.join(known)}")
        if word not in out:
            out.append(word)
    return out


def _storages(text: str) -> list[str]:
    """``basic,suffix,sam``: n-gram storage kinds, each once, in the order given; ``suffix+fill``
    and ``sam+fill`` are those storages filling their verify widths (``/fill_width``)."""
    return _choices(text, STORAGE_NAMES, "n-gram storage")


def _verify_rules(text: str) -> list[str]:
    """``residual,block``: chain verify rule names, each once, in the order given."""
    from generation.verify_names import VERIFY_RULE_NAMES

    return _choices(text, VERIFY_RULE_NAMES, "verify rule")


def _self_drafters(text: str) -> list[str]:
    try:
        return parse_self_drafters(text)
    except ValueError as exc:  # its message names --drafter, the flag it was written for
        raise argparse.ArgumentTypeError(str(exc).replace("--drafter ", "")) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _in_range(bounds: tuple[int, int]):
    """An integer within the REPL command's range (the same bound on both front ends)."""
    low, high = bounds

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high}, got {text!r}")
        return value

    return convert


_suffix_pattern = _in_range(SUFFIX_PATTERN_RANGE)
_ngram_n = _in_range(NGRAM_N_RANGE)


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench.py", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("models (passed to the loader)")
    m.add_argument("--target", help="target model (default: the offline SmolLM2-135M-Instruct)")
    m.add_argument("--drafter", help="drafter model (default: chosen by the loader)")
    m.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps (default auto)")
    m.add_argument("--dtype", default="auto", help="target dtype: auto, float32, bfloat16, float16")
    m.add_argument("--drafter-dtype", default=None, help="drafter dtype (default: the loader's)")
    m.add_argument("--threads", type=_positive, help="torch CPU threads (default: torch's)")
    w = p.add_argument_group("prompts")
    w.add_argument("--prompts", default="builtin",
                   help="'builtin' or a file in Spec-Bench's question.jsonl format")
    w.add_argument("--categories", type=_name_list,
                   help="comma-separated categories to keep ('mt_bench' = its 8 categories)")
    w.add_argument("--limit", type=_positive, help="at most this many prompts per category")
    w.add_argument("--turn", type=_positive, default=1,
                   help="which turn of multi-turn items to use (default 1; items without it are left out)")
    w.add_argument("--no-chat", dest="chat", action="store_false", default=DEFAULTS.chat,
                   help="feed the raw prompt text, without the tokenizer's chat template")
    w.add_argument("--multi-turn", action="store_true",
                   help="run each multi-turn item as a conversation: a later turn's prompt holds the earlier "
                        "turns and each strategy's own answers; n-gram state is kept within a conversation")
    w.add_argument("--session-size", type=_positive, default=None, metavar="K",
                   help="run K prompts of one category in a row as one session, n-gram state kept "
                        "across them; reported per position in the session")
    d = p.add_argument_group("decoding")
    d.add_argument("--strategies", type=_strategies, default=list(DEFAULT_STRATEGIES),
                   help=f"comma-separated subset of {','.join(OURS)} (default "
                        f"{','.join(DEFAULT_STRATEGIES)}; target is always run: it is the baseline)")
    d.add_argument("--peers", action="store_true",
                   help="also run transformers generate, assisted generation and prompt lookup")
    d.add_argument("--length", type=_positive, default=DEFAULTS.length,
                   help=f"new tokens per prompt (default {DEFAULTS.length})")
    d.add_argument("--gamma", type=_gamma_list, default=[2, 4, 8],
                   help="constant draft tokens per round: 4, or a sweep such as 1,2,4,8 "
                        "(default 2,4,8)")
    d.add_argument("--policies", type=_policies, default=list(DEFAULT_POLICIES),
                   metavar="LIST",
                   help="adaptive gamma policies run besides the constant gammas, each NAME@GAMMA "
                        "(the start or the maximum): default 'heuristic@4,confidence 0.4@20,"
                        "model@16'; 'none' for constant gammas only")
    d.add_argument("--processor", type=_processor, default=parse_processor(DEFAULTS.processor),
                   help="greedy, 'multinomial T', 'topk T K', 'nucleus T P', "
                        f"'topknucleus T K P' (default {DEFAULTS.processor})")
    d.add_argument("--trees", type=_int_list, default=[],
                   help="token-tree budgets run beside the chains at every constant gamma, "
                        "e.g. 8,16,32 (default: none)")
    d.add_argument("--hybrid", type=_hybrid_list, default=[], metavar="LIST",
                   help="hybrid speculative variants at every constant gamma, one per L, e.g. 2,4: the "
                        "--ngram-storage storage drafts in rounds whose match is at least L tokens "
                        "(suffix or sam; sam in place of an n-gram table; default: none)")
    d.add_argument("--tree-branch", type=_positive, default=DEFAULTS.tree_branch,
                   help=f"children per expanded tree node (default {DEFAULTS.tree_branch})")
    d.add_argument("--tree-sample", action=argparse.BooleanOptionalAction, default=DEFAULTS.tree_sample,
                   help="under sampling, the drafter model's trees draw children from q and are verified by "
                        "recursive rejection sampling (default on; --no-tree-sample: its top children)")
    d.add_argument("--self-drafters", type=_self_drafters, default=[], metavar="LIST",
                   help="self-drafters made from the target, run as speculative variants beside the pair's "
                        "drafter at every constant gamma (and every --trees budget), e.g. "
                        "self:bf16,self:int8,self:skip=auto (default: none)")
    d.add_argument("--ngram-storage", type=_storages, default=[DEFAULTS.ngram_storage], metavar="LIST",
                   help=f"NASD's storage, or several side by side, e.g. basic,suffix,sam (from "
                        f"{','.join(NGRAM_STORAGES)}; default {DEFAULTS.ngram_storage}); suffix and sam take "
                        "their defaults; "
                        f"suffix{FILL} and sam{FILL} fill their verify widths (/fill_width) "
                        "(docs/model_free.md)")
    d.add_argument("--arctic-suffix", action="store_true",
                   help="also run ArcticInference's suffix-decoding cache (pip package arctic-inference) "
                        "through our verify loop at every constant gamma, beside NASD's suffix storage")
    d.add_argument("--lookahead", type=_lookaheads, default=[DEFAULT_LOOKAHEAD], metavar="W:N:G,...",
                   help="the lookahead strategy's window W, n-gram size N and guesses G, one variant each "
                        "(default {}:{}:{}; runs when --strategies names lookahead)".format(*DEFAULT_LOOKAHEAD))
    d.add_argument("--ngram-n", type=_ngram_n, default=DEFAULTS.ngram_n,
                   help=f"n-gram order for NASD, {NGRAM_N_RANGE[0]} to {NGRAM_N_RANGE[1]} (default {DEFAULTS.ngram_n})")
    d.add_argument("--suffix-pattern", type=_suffix_pattern, default=DEFAULTS.suffix_pattern, metavar="P",
                   help="the suffix storage's longest matched tail P, "
                        f"{SUFFIX_PATTERN_RANGE[0]} to {SUFFIX_PATTERN_RANGE[1]} (default {DEFAULTS.suffix_pattern}, "
                        "as /suffix_pattern): a draft has at most 2P - m tokens after a match of m")
    d.add_argument("--top-k-filler", type=_positive, default=DEFAULTS.top_k_filler,
                   help=f"NASD: also store the target's top-k predictions (default {DEFAULTS.top_k_filler})")
    d.add_argument("--lookup-ngram", type=_positive, default=None,
                   help="HF prompt lookup: max_matching_ngram_size (default: transformers', 2)")
    d.add_argument("--assisted-confidence", type=float, default=0.0,
                   help="HF assisted: assistant_confidence_threshold; 0 (default) drafts exactly "
                        "gamma tokens a round like ours, transformers' own default is 0.4")
    d.add_argument("--verify", type=_verify_rules, default=[DEFAULTS.verify], metavar="RULES",
                   help="chain verify rules, each of our chain variants once per rule, side by side, e.g. "
                        f"block,residual,strict (default: {DEFAULTS.verify}, as the REPL's; a variant with another "
                        "rule is named ~RULE, speculative@4~residual; see docs/verify.md)")
    d.add_argument("--uag", choices=UAG_METHODS, default=DEFAULTS.uag,
                   help="a drafter with another tokenizer: draft through text (slem) or over "
                        f"the shared vocabulary (tli); default {DEFAULTS.uag}; see docs/models.md")
    d.add_argument("--compile", type=_compile_path, default=None, metavar="|".join(COMPILE_PATHS),
                   help="how our strategies' forwards run, as the REPL's /compile: off (eager, a growing cache), "
                        "static (a preallocated cache, eager forwards) or graphs (the static cache with each "
                        "fixed-width forward captured: CUDA graphs on CUDA); default graphs on CUDA, off on a CPU")
    r = p.add_argument_group("measurement and output")
    r.add_argument("--repeats", type=_positive, default=3, help="timed runs per prompt (default 3)")
    r.add_argument("--until-decided", type=_positive, default=None, metavar="MAX",
                   help="after --repeats, keep adding repeats until every --expect is met or missed "
                        "(its 95%% interval clear of the bound), at most MAX repeats in all")
    r.add_argument("--warmup", type=_non_negative, default=1,
                   help="untimed runs of every variant on the first prompt (default 1)")
    r.add_argument("--seed", type=int, default=DEFAULTS.seed,
                   help=f"the same seed for every run (default {DEFAULTS.seed})")
    r.add_argument("--out", type=Path, default=Path("bench_out"), help="output folder (default bench_out/)")
    r.add_argument("--no-chart", dest="chart", action="store_false", help="skip the PNG chart")
    r.add_argument("--expect", type=_expectation, action="append", default=[], metavar="A/B=X",
                   help="check that variant A runs at least X times as fast as B, e.g. "
                        "speculative@4/target=1.2; B may be 'best' (A's fastest constant gamma); "
                        "'@grounded' or '@CATEGORY' after X restricts the prompts (repeatable)")
    a = p.add_argument_group("the advisor (docs/advisor.md)")
    a.add_argument("--advise", action="store_true",
                   help="instead of the runs: advise, per category of the prompts, which way of drafting this pair "
                        "should use here (every drafter replayed from target AR's greedy output and ranked by "
                        "predicted speedup, the best --confirm run for real); writes advice.json, advice.md and "
                        "costs.json to --out")
    a.add_argument("--costs", metavar="FILE", default=None,
                   help="with --advise: the forward costs read from FILE (a costs.json measured elsewhere) "
                        "instead of measured here")
    a.add_argument("--confirm", type=_non_negative, default=CONFIRM, metavar="N",
                   help=f"with --advise: how many of the best methods to confirm by real runs (default {CONFIRM})")
    a.add_argument("--whatif", type=whatif_argument, default=None, metavar="batch|context|machine:NAME",
                   help="with --advise: project each category's best methods from their replayed rounds over "
                        "batch sizes 1 to 32, priced by forwards timed here by shape (batch) or on a card's "
                        "roofline (machine:NAME: H200, H100, A100, L40S, RTX3090), or at batch 1 over context "
                        "lengths, timed here (context; docs/why.md)")
    return p


def parse_settings(argv: list[str] | None = None) -> BenchSettings:
    """``bench.py``'s command line -> its settings (argparse exits with status 2 on a bad flag)."""
    return BenchSettings.from_namespace(build_parser().parse_args(argv))


def settings_dict(args: BenchSettings, prompt_count: int) -> dict:
    """The run's settings as they go into the JSON and the header."""
    return {
        "prompts": args.prompts, "categories": args.categories, "limit": args.limit,
        "turn": args.turn, "chat": args.chat, "prompt_count": prompt_count,
        "strategies": args.strategies, "peers": args.peers, "length": args.length,
        "gammas": args.gamma, "trees": args.trees, "tree_branch": args.tree_branch,
        "tree_sample": args.tree_sample, "hybrids": args.hybrid,
        "self_drafters": args.self_drafters,
        "policies": [f"{name}@{gamma}" for name, gamma in args.policies],
        "processor": args.processor.command_text(),
        "ngram_storage": ",".join(args.ngram_storage), "ngram_n": args.ngram_n, "suffix_pattern": args.suffix_pattern,
        "arctic_suffix": args.arctic_suffix, "multi_turn": args.multi_turn,
        "lookahead": [":".join(map(str, shape)) for shape in args.lookahead],
        "session_size": args.session_size,
        "top_k_filler": args.top_k_filler, "lookup_ngram": args.lookup_ngram,
        "assisted_confidence": args.assisted_confidence, "uag": args.uag, "verify": args.verify,
        "compile": args.compile,
        "repeats": args.repeats, "until_decided": args.until_decided,
        "warmup": args.warmup, "seed": args.seed, "device_arg": args.device,
        "dtype_arg": args.dtype, "expect": [e.text for e in args.expect],
    }


def default_loader(args: BenchSettings):
    """Load the model pair through the project's loader."""
    kwargs = dict(device=args.device, dtype=args.dtype)
    if args.drafter_dtype:
        kwargs["drafter_dtype"] = args.drafter_dtype
    return load_pair(args.target, args.drafter, **kwargs)


def main(argv: list[str] | None = None, *, loader=default_loader) -> int:
    """Run the benchmark; ``loader(settings)`` returns the model pair (tests pass their own)."""
    # Imported here: the session imports torch, which ``bench.py --help`` does without.
    from bench.session import run_session

    return run_session(parse_settings(argv), loader, settings_dict)


if __name__ == "__main__":
    sys.exit(main())
