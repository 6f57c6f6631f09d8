"""The command table: every setting a user can change, in one place.

Each :class:`Command` has a parser (words -> an :class:`Update`, range check inside), usage, help,
completions and the flag it doubles as. ``/gamma 6`` (:func:`execute`) and ``--gamma 6``
(:func:`apply_flags`) go through the same parser, and a failed parse changes nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

from generation.verify_names import VERIFY_RULE_NAMES
from repl.settings import PROCESSOR_ARGS, STRATEGIES, Settings, fmt_number
from sampling.spec import parse_processor_words
from utils.options import (
    FILLER_RANGE, GAMMA_POLICIES, GAMMA_RANGE, HYBRID_RANGE, LENGTH_RANGE, LOOKAHEAD_GUESSES_RANGE,
    LOOKAHEAD_NGRAM_RANGE, LOOKAHEAD_WINDOW_RANGE, MATCH_FACTOR_RANGE, MATCH_STORAGES, NGRAM_N_RANGE,
    NGRAM_STORAGES, OFF_WORDS, ON_WORDS, RTT_RANGE, SEED_RANGE, SUFFIX_OUTPUTS_RANGE, SUFFIX_PATTERN_RANGE,
    TREE_BRANCH_RANGE, TREE_RANGE, UAG_METHODS, COMPILE_PATHS, OptionError, closest, compile_path, finite_number,
    whole_number,
)
from utils.text_files import UnreadableText, read_text

# A command's words were rejected; the message says why (one line). The word checks below
# the front ends (utils.options, sampling.spec) raise it.
CommandError = OptionError


@dataclass(frozen=True)
class Update:
    """What a parsed command does: settings fields to set, notices to show, and for a session command
    its action and argument."""

    changes: dict[str, Any] = field(default_factory=dict)
    notices: tuple[str, ...] = ()
    action: str | None = None
    topic: str | None = None
    argument: str | None = None


@dataclass(frozen=True)
class Command:
    name: str
    args: str  # usage after the name, e.g. "N" or "[on|off]"
    help: str
    parse: Callable[[list[str], Settings], Update]
    show: Callable[[Settings], str] | None = None  # the current value, for /config
    values: tuple[str, ...] = ()  # completion candidates for the first argument
    flag: str | None = None  # command-line flag (without "--"); None: slash only
    toggle: bool = False
    fields: tuple[str, ...] = ()  # settings fields it writes, when not just its name

    @property
    def writes(self) -> tuple[str, ...]:
        if self.show is None:
            return ()
        return self.fields or (self.name,)

    @property
    def usage(self) -> str:
        return f"/{self.name} {self.args}".rstrip()

    @property
    def flag_usage(self) -> str:
        if self.toggle:
            return f"--{self.flag} / --no-{self.flag}"
        return f"--{self.flag} {self.args}".rstrip()


@dataclass(frozen=True)
class Reply:
    """The outcome of one slash command line."""

    ok: bool
    message: str
    notices: tuple[str, ...] = ()
    action: str | None = None
    topic: str | None = None
    argument: str | None = None


# ---------------------------------------------------------------- word parsers

def _one_word(words: list[str], what: str) -> str:
    if not words:
        raise CommandError(f"missing {what}")
    if len(words) > 1:
        raise CommandError(f"expected one {what}, got {len(words)} words")
    return words[0]


def _on_off(words: list[str], current: bool) -> bool:
    """No word flips the toggle; on/off (true/false, yes/no, 1/0) sets it."""
    if not words:
        return not current
    word = _one_word(words, "on or off").lower()
    if word in ON_WORDS:
        return True
    if word in OFF_WORDS:
        return False
    raise CommandError(f"expected on or off, got {word!r}")


# ------------------------------------------------------------- command parsers

def _int_setting(name: str, what: str, bounds: tuple[int, int]):
    def parse(words: list[str], settings: Settings) -> Update:
        return Update({name: whole_number(_one_word(words, what), what, *bounds)})

    parse.bounds = bounds  # the accepted range, for the command reference (scripts/commands_doc.py)
    return parse


def _toggle_setting(name: str):
    def parse(words: list[str], settings: Settings) -> Update:
        return Update({name: _on_off(words, getattr(settings, name))})

    return parse


def parse_processor(words: list[str], settings: Settings | None = None) -> Update:
    """``NAME [ARGS]`` -> a ProcessorSpec (``sampling.spec.parse_processor_words``, the one grammar)."""
    spec, notices = parse_processor_words(words)
    return Update({"processor": spec}, notices=notices)


def parse_ngram_storage(words: list[str], settings: Settings | None = None) -> Update:
    """``basic|onelevel|recycling N`` or ``suffix|sam`` (these take no N)."""
    if not words:
        raise CommandError("missing storage kind")
    kind = words[0].lower()
    if kind not in NGRAM_STORAGES:
        hint = closest(kind, NGRAM_STORAGES)
        raise CommandError(f"unknown storage {words[0]!r}{hint}; choose {' or '.join(NGRAM_STORAGES)}")
    if kind in MATCH_STORAGES:
        if len(words) != 1:
            own = "/suffix_pattern, /suffix_outputs, /match_factor" if kind == "suffix" else "/match_factor, /corpus"
            raise CommandError(f"{kind} takes no N (its settings: {own})")
        return Update({"ngram_storage": kind})
    if len(words) != 2:
        raise CommandError(f"expected a storage kind and N, got {len(words)} words")
    n = whole_number(words[1], "N", *NGRAM_N_RANGE)
    return Update({"ngram_storage": kind, "ngram_n": n})


def parse_match_factor(words: list[str], settings: Settings | None = None) -> Update:
    """``A`` from 0.1 to 16."""
    value = finite_number(_one_word(words, "A"), "A")
    lo, hi = MATCH_FACTOR_RANGE
    if not lo <= value <= hi:
        raise CommandError(f"A must be between {lo:g} and {hi:g}, got {value:g}")
    return Update({"match_factor": value})


parse_match_factor.bounds = MATCH_FACTOR_RANGE


def parse_corpus(words: list[str], settings: Settings | None = None) -> Update:
    """``FILE`` or ``off``. The file must be readable UTF-8 text now (a missing, unreadable, binary or
    empty one is refused in one line, the setting left as it was); it is read again when the sam
    storage first needs it (a file that cannot be read then fails that run with one line)."""
    if not words:
        raise CommandError("missing file name (or off)")
    path = " ".join(words)
    if path.lower() in OFF_WORDS:
        return Update({"corpus": ""})
    try:
        text = read_text(path)
    except UnreadableText as e:
        raise CommandError(f"cannot read corpus file {path!r}: {e}") from None
    if not text.strip():
        raise CommandError(f"corpus file {path!r} holds no text")
    return Update({"corpus": path})


def parse_gamma_policy(words: list[str], settings: Settings | None = None) -> Update:
    """``constant | heuristic | confidence T | model``; T in (0, 1)."""
    if not words:
        raise CommandError("missing policy name")
    name, rest = words[0].lower(), words[1:]
    if name not in GAMMA_POLICIES:
        hint = closest(name, GAMMA_POLICIES)
        raise CommandError(f"unknown policy {words[0]!r}{hint}; choose one of {', '.join(GAMMA_POLICIES)}")
    if name != "confidence":
        if rest:
            raise CommandError(f"{name} takes no value, got {len(rest)}")
        return Update({"gamma_policy": name})
    threshold = finite_number(_one_word(rest, "threshold T"), "T")
    if not 0 < threshold < 1:
        raise CommandError(f"T must be in (0, 1), got {threshold}")
    return Update({"gamma_policy": name, "gamma_threshold": threshold})


def _ms_setting(name: str, other: str, clash: str):
    """A round trip in milliseconds; ``clash`` is the notice shown when the
    other round-trip setting is also non-zero."""
    def parse(words: list[str], settings: Settings) -> Update:
        value = finite_number(_one_word(words, "MS"), "MS")
        lo, hi = RTT_RANGE
        if not lo <= value <= hi:
            raise CommandError(f"MS must be between {lo:g} and {hi:g}, got {value:g}")
        notices = (clash,) if value > 0 and getattr(settings, other) > 0 else ()
        return Update({name: value}, notices=notices)

    parse.bounds = RTT_RANGE  # the accepted range, for the command reference
    return parse


RTT_CLASH = ("with --rtt-inject the measured costs already include the injected wait: "
             "/rtt adds its round trip on top of it")


def _show_ms(value: float) -> str:
    return f"{value:g} ms"


def parse_uag(words: list[str], settings: Settings | None = None) -> Update:
    """``slem|tli``."""
    name = _one_word(words, "method").lower()
    if name not in UAG_METHODS:
        hint = closest(name, UAG_METHODS)
        raise CommandError(f"unknown method {words[0]!r}{hint}; choose {' or '.join(UAG_METHODS)}")
    return Update({"uag": name})


def parse_verify(words: list[str], settings: Settings | None = None) -> Update:
    """``residual|block|strict``."""
    name = _one_word(words, "rule").lower()
    if name not in VERIFY_RULE_NAMES:
        hint = closest(name, VERIFY_RULE_NAMES)
        raise CommandError(f"unknown verify rule {words[0]!r}{hint}; choose {', '.join(VERIFY_RULE_NAMES)}")
    return Update({"verify": name})


def parse_compile(words: list[str], settings: Settings | None = None) -> Update:
    """``off|static|graphs`` (``utils.options.compile_path``): the setting only, read at the next prompt."""
    return Update({"compile": compile_path(_one_word(words, "compile path"))})


STRATEGY_WORDS = {**{k: k for k in STRATEGIES}, "nasd": "ngram", "spec": "speculative"}


def parse_inspect(words: list[str], settings: Settings | None = None) -> Update:
    """``[STRATEGY] [ROUND]``: a strategy name (or nasd) and/or a round number >= 1; only their form
    (the session checks them against the last prompt)."""
    if len(words) > 2:
        raise CommandError(f"expected at most a strategy and a round, got {len(words)} words")
    strategy = round_word = None
    for word in words:
        if word.isdigit() or word.lstrip("+-").isdigit():
            if round_word is not None:
                raise CommandError(f"expected one round number, got {words[0]!r} and {words[1]!r}")
            round_word = word
        elif strategy is None and word.lower() in STRATEGY_WORDS:
            strategy = STRATEGY_WORDS[word.lower()]
        else:
            hint = closest(word.lower(), STRATEGY_WORDS)
            raise CommandError(f"unknown strategy {word!r}{hint}; choose speculative or ngram (nasd), "
                               f"then a round number")
    if round_word is not None:
        whole_number(round_word, "ROUND", 1, 10**9)
    return Update(action="inspect", topic=strategy, argument=round_word)


def parse_advise(words: list[str], settings: Settings | None = None) -> Update:
    """``[PROMPT]``: the prompt's text (the last prompt when none); the session checks it fits."""
    text = " ".join(words).strip()
    if text.startswith("/"):
        raise CommandError(f"a prompt, not a command, follows /advise (got {words[0]!r})")
    return Update(action="advise", argument=text or None)


def parse_whatif(words: list[str], settings: Settings | None = None) -> Update:
    """``batch``, ``context`` or ``machine NAME`` (``analysis.roofline.PROFILES``): the last prompt's
    drafting runs projected over batch size, context length, or another machine."""
    from analysis.roofline import PROFILES, profile_named

    lowered = [w.lower() for w in words]
    if lowered in (["batch"], ["context"]):
        return Update(action="whatif", topic=lowered[0])
    if lowered[:1] == ["machine"]:
        if len(words) != 2:
            raise CommandError(f"name one machine: /whatif machine NAME (one of {', '.join(PROFILES)})")
        try:
            return Update(action="whatif", topic="machine", argument=profile_named(words[1]).name)
        except ValueError as e:
            raise CommandError(str(e)) from None
    raise CommandError(f"choose batch, context or machine NAME, got {' '.join(words) or 'nothing'!r}")


def _parse_save(words: list[str], settings: Settings) -> Update:
    if not words:
        raise CommandError("missing file name")
    return Update(action="save", argument=" ".join(words))


def _no_args(action: str):
    def parse(words: list[str], settings: Settings) -> Update:
        if words:
            raise CommandError("takes no arguments")
        return Update(action=action)

    return parse


def _parse_help(words: list[str], settings: Settings) -> Update:
    if not words:
        return Update(action="help")
    name = _one_word(words, "command name").lstrip("/").lower()
    if name not in COMMANDS:
        raise CommandError(f"no command /{name}{closest(name, COMMANDS, prefix='/')}")
    return Update(action="help", topic=name)


def _on_off_text(value: bool) -> str:
    return "on" if value else "off"


def _int(name: str, what: str, bounds: tuple[int, int], help: str) -> Command:
    """A whole-number setting: ``/name WHAT`` and ``--name WHAT``, ``WHAT`` within ``bounds``."""
    return Command(name, what, help, _int_setting(name, what, bounds), show=lambda s: str(getattr(s, name)),
                   flag=name.replace("_", "-"))


def _toggle(name: str, help: str, flag: str | None = None) -> Command:
    return Command(
        name, "[on|off]", help, _toggle_setting(name),
        show=lambda s: _on_off_text(getattr(s, name)),
        values=("on", "off"), flag=flag or name.replace("_", "-"), toggle=True,
    )


def _show_storage(s: Settings) -> str:
    return s.ngram_storage if s.ngram_storage in MATCH_STORAGES else f"{s.ngram_storage} {s.ngram_n}"


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in [
        _int("gamma", "N", GAMMA_RANGE, f"drafts per speculative step ({GAMMA_RANGE[0]}-{GAMMA_RANGE[1]})"),
        _int("length", "N", LENGTH_RANGE, "maximum number of new tokens per strategy"),
        Command("processor", "greedy [T] | multinomial T | topk T K | nucleus T P | topknucleus T K P",
                "sampling: T temperature (0 = greedy), K top-k >= 1, P top-p in (0, 1]",
                parse_processor, show=lambda s: s.processor.describe(),
                values=tuple(PROCESSOR_ARGS), flag="processor"),
        _toggle("speculative", "run speculative decoding (drafter model proposes)"),
        _toggle("ngram", "run NASD (n-gram storage proposes)"),
        _toggle("lookahead", "run lookahead decoding (Fu et al. 2024: n-grams from a Jacobi window, verified "
                "in the same target forward; off by default)"),
        _toggle("target", "run target autoregressive decoding (the baseline)", flag="target-ar"),
        _toggle("drafter", "run drafter autoregressive decoding", flag="drafter-ar"),
        _toggle("cache", "use the KV cache"),
        _toggle("chat", "wrap the prompt in the chat template"),
        _toggle("debug", "colour each round: accepted, rejected, target token"),
        _toggle("live", "draw each strategy's rounds as they run (drafts dim until verified) with a "
                "status line; on in a terminal, off with --json or piped output"),
        _int("tree", "N", TREE_RANGE,
             "verify a token tree of at most N draft nodes per round, depth up to gamma "
             f"(0 = a chain; {TREE_RANGE[0]}-{TREE_RANGE[1]}); models that cannot take a tree run chains"),
        _int("tree_branch", "K", TREE_BRANCH_RANGE,
             "token trees: children per expanded node (drafter's top-K, "
             f"the storage's top-K continuations; {TREE_BRANCH_RANGE[0]}-{TREE_BRANCH_RANGE[1]})"),
        _toggle("tree_sample", "token trees under sampling: draw each node's children from the drafter's q "
                "and verify them by recursive rejection sampling (default; off: its top children, the target's "
                "draw followed); the drafter model only, greedy always takes the top children"),
        Command("set_ngramstorage", "basic|onelevel|recycling N | suffix | sam",
                f"NASD n-gram storage kind and N ({NGRAM_N_RANGE[0]}-{NGRAM_N_RANGE[1]}); suffix "
                "(SuffixDecoding: suffix tries over this prompt and output and over earlier outputs) and "
                "sam (a suffix automaton over this prompt and output, and /corpus) take no N",
                parse_ngram_storage, show=_show_storage, values=NGRAM_STORAGES, flag="ngram-storage",
                fields=("ngram_storage", "ngram_n")),
        _int("suffix_pattern", "P", SUFFIX_PATTERN_RANGE,
             "suffix storage: the longest tail of the sequence matched (P), in tokens "
             f"({SUFFIX_PATTERN_RANGE[0]}-{SUFFIX_PATTERN_RANGE[1]}); its tries keep substrings of up to 2P"),
        _int("suffix_outputs", "N", SUFFIX_OUTPUTS_RANGE,
             "suffix storage: how many earlier outputs (M) its global trie keeps, the "
             f"oldest out first ({SUFFIX_OUTPUTS_RANGE[0]}-{SUFFIX_OUTPUTS_RANGE[1]}; 0 = no global trie); "
             "kept across prompts while /reset_in_between is off"),
        Command("match_factor", "A", "suffix and sam storages: a match of m tokens drafts at most A x m "
                f"tokens (at least 1, at most gamma; A from {MATCH_FACTOR_RANGE[0]:g} to {MATCH_FACTOR_RANGE[1]:g})",
                parse_match_factor, show=lambda s: fmt_number(s.match_factor), flag="match-factor"),
        _toggle("fill_width", "suffix and sam storages: measure the target's verify forward by width once "
                "(a few seconds) and draw a round's draft longer when a wider verify is measured cheaper "
                "(lossless: the extra drafts are verified like the rest)"),
        Command("corpus", "FILE|off", "sam storage: also match the sequence in this UTF-8 text file (tokenised once "
                "with the target's tokenizer, its automaton built once and kept across prompts)",
                parse_corpus, show=lambda s: s.corpus or "off", flag="corpus"),
        Command("hybrid", "L", "speculative decoding: in a round where the model-free storage's match is at "
                "least L tokens, verify its draft instead of the drafter model's (the /set_ngramstorage "
                "suffix or sam storage, with their settings; sam in place of an n-gram table; "
                f"{HYBRID_RANGE[0]}-{HYBRID_RANGE[1]}, 0 = off)",
                _int_setting("hybrid", "L", HYBRID_RANGE), show=lambda s: str(s.hybrid) if s.hybrid else "off",
                flag="hybrid"),
        _int("top_k_filler", "N", FILLER_RANGE, "NASD: how many top target tokens fill the storage per step"),
        _int("lookahead_window", "W", LOOKAHEAD_WINDOW_RANGE,
             "lookahead: columns of the Jacobi window (W); each round feeds "
             f"(W - 1) + (N - 2) x W window tokens ({LOOKAHEAD_WINDOW_RANGE[0]}-{LOOKAHEAD_WINDOW_RANGE[1]})"),
        _int("lookahead_ngram", "N", LOOKAHEAD_NGRAM_RANGE,
             "lookahead: n-gram size (N); the window has N - 1 levels and each "
             f"candidate drafts N - 1 tokens ({LOOKAHEAD_NGRAM_RANGE[0]}-{LOOKAHEAD_NGRAM_RANGE[1]})"),
        _int("lookahead_guesses", "G", LOOKAHEAD_GUESSES_RANGE,
             "lookahead: candidate n-grams verified per round, and how many the "
             f"pool keeps per first token (G; {LOOKAHEAD_GUESSES_RANGE[0]}-{LOOKAHEAD_GUESSES_RANGE[1]})"),
        _toggle("reset_in_between", "empty the n-gram storage (and lookahead's n-gram pool) before every prompt"),
        _int("seed", "N", SEED_RANGE, "random seed set before every strategy"),
        Command("gamma_policy", "constant | heuristic | confidence T | model",
                "how many drafts each round asks for: always gamma; +2/-1 after each round; up to gamma "
                "until the drafter's confidence falls under T in (0, 1); or 0..max(gamma, 16) chosen "
                "for the most predicted tokens/s from measured acceptance and costs (a prediction, "
                "not a win: speculative decoding with it reached 0.92x the best constant gamma in "
                "hindsight on held-out prompts, NASD 1.00x; docs/benchmark.md)",
                parse_gamma_policy, show=lambda s: s.gamma_policy_text(), values=GAMMA_POLICIES,
                flag="gamma-policy", fields=("gamma_policy", "gamma_threshold")),
        Command("rtt", "MS", "what-if: a network round trip of MS milliseconds on every target call "
                "(on a served target: per request, in place of the measured one); "
                "the panels and /stats add the predicted speedup and best γ at it (0 = off)",
                _ms_setting("rtt", "rtt_inject", RTT_CLASH), show=lambda s: _show_ms(s.rtt), flag="rtt"),
        Command("rtt_inject", "MS", "really wait MS milliseconds before every target forward "
                "(speculative, NASD, target AR), to check the /rtt prediction; counted as verify time",
                _ms_setting("rtt_inject", "rtt", RTT_CLASH), show=lambda s: _show_ms(s.rtt_inject),
                flag="rtt-inject"),
        Command("uag", "slem|tli",
                "a drafter with another tokenizer: slem drafts through text (any processor), tli "
                "samples over the shared vocabulary; both are lossless",
                parse_uag, show=lambda s: s.uag, values=UAG_METHODS, flag="uag"),
        Command("verify", "residual|block|strict",
                "the chain verify rule: residual (the token rule of Leviathan et al.), block (block "
                "verification, Sun et al. 2025: the drafts judged jointly, never fewer accepted in "
                "expectation) or strict (a draft kept iff it equals the target's own draw); all three "
                "lossless; token trees keep their own rules",
                parse_verify, show=lambda s: s.verify, values=VERIFY_RULE_NAMES, flag="verify"),
        Command("compile", "off|static|graphs",
                "how the target's and the drafter model's forwards run: off (eager, a growing cache), static "
                "(a preallocated cache rolled back by resetting lengths, eager forwards) or graphs (the static "
                "cache with its forwards padded to width buckets 1, 2, 4 ... 64, each captured once: CUDA "
                "graphs on CUDA); default graphs on "
                "CUDA, off on a CPU; a model that cannot take it runs off and its panel says why",
                parse_compile, show=lambda s: s.compile, values=COMPILE_PATHS, flag="compile"),
        Command("config", "", "show every setting and the models", _no_args("config")),
        Command("stats", "", "the last prompt's acceptance by position, accepted lengths, "
                "phase times and the speedup model", _no_args("stats")),
        Command("selftest", "", "check that speculative decoding and NASD keep the target's output "
                "on this pair (greedy, cache on and off, and sampling)", _no_args("selftest")),
        Command("advise", "[PROMPT]", "which way of drafting this pair should use here, and why: every "
                "drafter replayed from target AR's greedy output on the last prompt (or PROMPT), ranked by "
                "predicted speedup from this machine's forward costs (measured once, or --costs FILE), the "
                "best 2 run for real to confirm (docs/advisor.md)", parse_advise),
        Command("whatif", "batch | context | machine NAME", "the last prompt's drafting runs projected over "
                "batch sizes 1 to 32: their own rounds priced by the target's forwards timed here by batch and "
                "width (batch), or by a machine's roofline (machine H100, A100, H200, L40S, RTX3090: its "
                "published bandwidth and peak); or at batch 1 over context lengths up to the model's window "
                "(context); and where speculation stops paying; /save NAME.html then charts it (docs/why.md)",
                parse_whatif, values=("batch", "context", "machine")),
        Command("inspect", "[STRATEGY] [ROUND]", "what both models thought at each drafted position of "
                "a round of the last prompt: q(x), p(x), min(1, p/q), entropies, top-5 tokens, the "
                "residual at a rejection (default: the first round with a rejection)", parse_inspect,
                values=("speculative", "ngram")),
        Command("save", "FILE", "write the last prompt's trace (settings, models, rounds, metrics) "
                "as JSON, or, for a FILE ending in .html, a self-contained HTML report; "
                "replay a trace with infer.py --replay FILE", _parse_save),
        Command("help", "[COMMAND]", "list the commands, or explain one", _parse_help,
                values=()),
        Command("clear", "", "clear the screen", _no_args("clear")),
        Command("quit", "", "leave (Ctrl-D does the same)", _no_args("quit")),
    ]
}


# ------------------------------------------------------------------ dispatch

def apply_update(settings: Settings, update: Update) -> None:
    for name, value in update.changes.items():
        setattr(settings, name, value)


def describe_changes(settings: Settings, update: Update) -> str:
    """``gamma: 4 -> 6`` style confirmation from the settings after the update."""
    touched = [c for c in COMMANDS.values() if set(c.writes) & set(update.changes)]
    return ", ".join(f"{c.name}: {c.show(settings)}" for c in touched)


def execute(line: str, settings: Settings) -> Reply:
    """Run one slash command line against ``settings``; on any error they are left as they were and
    the reply is one line with the usage."""
    words = line.strip().split()
    if not words or not words[0].startswith("/") or words[0] == "/":
        return Reply(False, "commands start with / followed by a name; type /help for the list")
    name = words[0][1:].lower()
    command = COMMANDS.get(name)
    if command is None:
        hint = closest(name, COMMANDS, prefix="/") or ""
        return Reply(False, f"unknown command /{name}{hint}; type /help for the list")
    try:
        update = command.parse(words[1:], settings)
    except CommandError as e:
        return Reply(False, f"{command.usage.split()[0]}: {e} (usage: {command.usage})")
    apply_update(settings, update)
    message = describe_changes(settings, update)
    return Reply(True, message, update.notices, update.action, update.topic, update.argument)


def completions(text_before_cursor: str) -> list[str]:
    """Candidates for the word being typed: command names, then first values."""
    words = text_before_cursor.split(" ")
    if len(words) == 1:
        return [f"/{n}" for n in COMMANDS if f"/{n}".startswith(words[0].lower())]
    command = COMMANDS.get(words[0][1:].lower())
    if command is None or len(words) != 2:
        return []
    values = command.values or (tuple(COMMANDS) if command.name == "help" else ())
    return [v for v in values if v.startswith(words[1].lower())]


# ------------------------------------------------------------- command line

def _dest(command: Command) -> str:
    return f"cmd_{command.name}"


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per settable command, documented from the same table."""
    defaults = Settings()
    group = parser.add_argument_group("session settings (each is also a slash command)")
    for command in COMMANDS.values():
        if command.flag is None:
            continue
        default = command.show(defaults) if command.show else ""
        text = f"{command.help} [/{command.name}; default: {default}]".replace("%", "%%")
        if command.toggle:
            group.add_argument(f"--{command.flag}", dest=_dest(command), default=None,
                               action=argparse.BooleanOptionalAction, help=text)
        else:
            multi = " " in command.args
            group.add_argument(f"--{command.flag}", dest=_dest(command), default=None,
                               nargs="+" if multi else None, metavar="WORD" if multi else command.args,
                               help=text + (f"; takes {command.args}" if multi else ""))


def apply_flags(namespace: argparse.Namespace, settings: Settings) -> list[str]:
    """Write the given flags into ``settings`` through the command parsers; return the notices. The
    first bad flag raises CommandError, before anything is changed."""
    updates, notices = [], []
    for command in COMMANDS.values():
        if command.flag is None:
            continue
        value = getattr(namespace, _dest(command), None)
        if value is None:
            continue
        if command.toggle:
            words = ["on" if value else "off"]
        else:
            words = " ".join(value).split() if isinstance(value, list) else str(value).split()
        try:
            update = command.parse(words, settings)
        except CommandError as e:
            raise CommandError(f"--{command.flag}: {e} (usage: {command.flag_usage})") from None
        updates.append(update)
        notices.extend(update.notices)
    for update in updates:
        apply_update(settings, update)
    return notices
