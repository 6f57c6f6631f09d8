"""A decoding strategy as a value: what to run, with which drafter, γ, policy and processor."""

from __future__ import annotations

from dataclasses import dataclass

from model_drafters.cross_tokenizer import CrossTokenizerOptions  # re-exported: engine's name for it
from sampling.spec import ProcessorSpec
# The most drafts a round may ask for, and the longest match a hybrid may ask for: defined with the
# options' ranges (the REPL's /gamma and /hybrid and the benchmark's flags end there too).
from utils.options import COMPILE_PATHS, MAX_GAMMA, MAX_HYBRID_MATCH

DEFAULT_GAMMA = 4
# The models autoregressive decoding may run (``Strategy.model``).
MODELS = ("target", "drafter")


@dataclass(frozen=True)
class NGramOptions:
    """How NASD's n-gram drafter and its storage are set up.

    ``storage`` is ``basic`` (every order up to n), ``onelevel`` (n-grams
    only), ``recycling`` (Token Recycling), ``suffix`` (SuffixDecoding's
    tries, ``ngram_assisted.suffix``) or ``sam`` (a suffix automaton,
    ``ngram_assisted.sam``). ``reset`` empties the storage before the run;
    without it the storage keeps what earlier runs taught it (it lives in the
    :class:`engine.state.EngineState`): for ``suffix``, the global trie of
    earlier outputs.

    ``suffix`` and ``sam`` ignore ``n``, the filler and the two stop flags:
    ``max_pattern`` (P) is the longest tail ``suffix`` matches,
    ``max_outputs`` (M) how many earlier outputs its global trie keeps, and
    ``factor`` (α) caps both storages' drafts at α x the match length.
    ``corpus`` (``sam`` only): a text file tokenised once with the target's
    tokenizer, whose automaton is built once and matched beside the context.
    ``fill_width`` (``suffix`` and ``sam``, chain rounds): measure the target's
    verify forward by width once (``engine.widths``) and draw a round's chain
    longer when a wider verify is measured cheaper (``generation.widths``).
    """

    storage: str = "basic"
    n: int = 3
    top_k_filler: int = 3
    stop_if_unknown: bool = True
    confident_start: bool = True
    reset: bool = True
    max_pattern: int = 16
    factor: float = 1.0
    max_outputs: int = 64
    corpus: str | None = None
    fill_width: bool = False


@dataclass(frozen=True)
class HybridOptions:
    """Speculative decoding that drafts from a model-free storage in a round whose match is long.

    The ``model`` drafter takes these options: in a round where the storage's match is at
    least ``min_match`` (L) tokens its draft is verified, otherwise the drafter model's
    (``ngram_assisted.hybrid``). 0 turns the hybrid off: the drafter model drafts every
    round. ``retrieval`` sets up the storage as for NASD: ``suffix`` or ``sam`` with their
    settings; an n-gram table (``basic``, ``onelevel``, ``recycling``) carries no match
    length, so ``sam`` over the context, with its defaults, drafts in its place.
    ``model``: how the drafter model drafts should its tokenizer differ
    (:class:`CrossTokenizerOptions`; None: SLEM).
    """

    min_match: int = 0
    retrieval: NGramOptions = NGramOptions(storage="sam")
    model: CrossTokenizerOptions | None = None

    def __post_init__(self):
        value = self.min_match
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_HYBRID_MATCH:
            raise ValueError(f"the hybrid's match length L must be an integer from 0 to {MAX_HYBRID_MATCH}, "
                             f"got {value!r}")


@dataclass(frozen=True)
class LookaheadOptions:
    """Lookahead decoding's shape (``ngram_assisted.lookahead``; Fu et al., ICML 2024).

    ``window`` (W): columns of the Jacobi window; ``ngram`` (N, at least 3): the n-gram
    size, so the window has N - 1 levels and each candidate drafts N - 1 tokens;
    ``guesses`` (G): candidate n-grams verified per round, and how many the pool keeps
    per first token. A round feeds (W - 1) + (N - 2) W window rows and at most
    G (N - 1) candidate nodes. The defaults are sized for a CPU, where every row
    fed costs time (docs/lookahead.md). The n-gram pool lives in the
    :class:`engine.state.EngineState`; ``reset`` empties it before the run (the
    paper's way); without it the pool keeps what earlier runs found.
    """

    window: int = 5
    ngram: int = 3
    guesses: int = 5
    reset: bool = True

    @property
    def nodes(self) -> int:
        """The most candidate nodes a round verifies: G n-grams of N - 1 drafts each."""
        return self.guesses * (self.ngram - 1)


def lookahead_strategy(options: LookaheadOptions = LookaheadOptions(), *, key: str = "lookahead",
                       **fields) -> "Strategy":
    """The ``Strategy`` of lookahead decoding with ``options``: the ``lookahead`` drafter, trees
    of at most G (N - 1) nodes and N - 1 levels (γ = N - 1 under the constant policy).
    ``fields``: any other ``Strategy`` field (processor, max_gen_len, seed, ...)."""
    return Strategy(key, drafter="lookahead", drafter_options=options, gamma=options.ngram - 1,
                    gamma_policy="constant", tree=options.nodes, **fields)


@dataclass(frozen=True)
class Strategy:
    """One way to decode a prompt.

    ``key`` is a label: it names the strategy as a front end shows it
    ("speculative", "ngram", "target", "drafter", or a benchmark variant's
    name), and the engine's persistent state keeps one γ policy per key; it
    never changes what runs. ``drafter`` is a key of
    :data:`engine.drafters.DRAFTERS` ("model", "ngram", ...) or None for
    autoregressive decoding of ``model``: "target" (the default) or
    "drafter" (the pair's drafter model on its own, which never pays an
    injected round trip). ``drafter_options`` belongs to the
    drafter kind (:class:`NGramOptions` for "ngram"; None,
    :class:`CrossTokenizerOptions` or :class:`HybridOptions` for "model";
    None or :class:`CrossTokenizerOptions` for "cross_tokenizer"); a new
    drafter brings its own options type. On a pair whose drafter has a
    tokenizer of its own, "model" drafts through the cross-tokenizer drafter and
    drafter AR (``model="drafter"``) runs on the drafter's own ids (its tokens
    are then drafter ids).

    ``gamma_policy`` is a name ``generation.gamma_policies.make_policy``
    takes ("constant", "heuristic", "confidence", "model"; "confidence 0.4"
    carries its threshold), ``gamma_threshold`` the confidence threshold.
    ``processor`` is a :class:`ProcessorSpec` or a built processor. With a
    ``seed`` the run seeds torch's global generator and a ``torch.Generator``
    on the decoding model's device; with None it seeds nothing.
    ``target_delay_s`` waits that long before every target forward (an
    injected network round trip, the REPL's ``/rtt_inject``); the drafter
    model decoding on its own never waits. ``tree`` > 0
    verifies token trees of at most that many draft nodes per round
    (``tree_branch`` children per expanded node; ``generation.tree``); models
    that cannot take a tree run chains and the result says why.
    ``tree_sample``: under sampling, a drafter model draws each node's
    children from q and recursive rejection sampling verifies them
    (``generation.accept.accept_tree_rrs``); otherwise its top children.
    ``compile`` (``utils.options.COMPILE_PATHS``): ``off`` (the dynamic cache, eager),
    ``static`` (a preallocated cache rolled back by length, eager) or ``graphs`` (the
    static path with captured fixed-width forwards); a model the static path refuses
    runs ``off`` and the result's ``compile`` says why (``kvcache.static``, docs/static.md).
    ``inspect`` records the per-token inspector's numbers in each round of
    a drafting strategy (``generation.inspection``; read back in the round's
    one host sync); False leaves ``Round.inspection`` None. ``verify`` is the
    chain verify rule (``generation.verify_rules``): ``residual`` (the token
    rule of Leviathan et al. / Chen et al.), ``block`` (block verification,
    Sun et al. 2025) or ``strict`` (a draft is kept iff it equals the
    target's own draw); all three lossless. ``decisions``: under greedy, a run
    of the target (target AR, every drafting strategy) keeps the top-k of the
    target row that decided each token (``generation.decisions``), which
    ``analysis.divergence`` reads to explain a difference from target AR;
    drafter AR and sampled runs never keep them. ``max_rounds`` > 0 ends a drafting run after
    that many rounds (``stop_reason`` ``"rounds"``): a caller that reads only the first round's
    tokens (the self-test's sampling draws) pays for no other.
    """

    key: str
    drafter: str | None = None
    model: str = "target"
    drafter_options: object = None
    gamma: int = DEFAULT_GAMMA
    gamma_policy: str = "constant"
    gamma_threshold: float | None = None
    processor: object = ProcessorSpec()
    use_cache: bool = True
    max_gen_len: int = 128
    seed: int | None = None
    target_delay_s: float = 0.0
    tree: int = 0
    tree_branch: int = 2
    tree_sample: bool = False
    inspect: bool = True
    compile: str = "off"
    verify: str = "residual"
    decisions: bool = True
    max_rounds: int = 0

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.compile not in COMPILE_PATHS:
            raise ValueError(f"compile must be one of {', '.join(COMPILE_PATHS)}, got {self.compile!r}")

    @property
    def drafts(self) -> bool:
        """Whether the strategy drafts (runs the verify loop) rather than decoding one token a step."""
        return self.drafter is not None
