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

    ``storage``: ``basic``, ``onelevel``, ``recycling`` (Token Recycling), ``suffix`` (SuffixDecoding)
    or ``sam`` (a suffix automaton). ``reset`` empties it before the run; otherwise it keeps what earlier
    runs taught it (it lives in the :class:`engine.state.EngineState`).

    ``suffix`` and ``sam`` ignore ``n``, the filler and the stop flags: ``max_pattern`` (P) is the longest
    tail ``suffix`` matches, ``max_outputs`` (M) how many earlier outputs it keeps, ``factor`` (α) caps
    drafts at α x the match length; ``corpus`` (``sam``): a text file matched beside the context;
    ``fill_width``: draw a chain longer when a wider verify is measured cheaper (``generation.widths``).
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

    In a round whose storage match is at least ``min_match`` (L) tokens the storage's draft is verified,
    otherwise the drafter model's (``ngram_assisted.hybrid``); 0 turns it off. ``retrieval``: the storage,
    as for NASD (an n-gram table has no match length, so ``sam`` with its defaults stands in).
    ``model``: how the drafter drafts should its tokenizer differ (None: SLEM).
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

    ``window`` (W) columns; ``ngram`` (N >= 3), so N - 1 levels and N - 1 drafts per candidate;
    ``guesses`` (G) candidates verified per round and kept per first token. A round feeds
    (W - 1) + (N - 2) W window rows and at most G (N - 1) nodes; the defaults are sized for a CPU
    (docs/lookahead.md). ``reset`` empties the pool (in the ``EngineState``) before the run.
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
    """The ``Strategy`` of lookahead decoding with ``options``: trees of at most G (N - 1) nodes and
    N - 1 levels (γ = N - 1); ``fields``: any other ``Strategy`` field."""
    return Strategy(key, drafter="lookahead", drafter_options=options, gamma=options.ngram - 1,
                    gamma_policy="constant", tree=options.nodes, **fields)


@dataclass(frozen=True)
class Strategy:
    """One way to decode a prompt (docs/engine.md).

    ``key`` is a label (the engine keeps one γ policy per key); it never changes what runs. ``drafter``
    is a key of :data:`engine.drafters.DRAFTERS`, or None for autoregressive decoding of ``model``
    ("target" or "drafter"; drafter AR never pays an injected round trip and, with a tokenizer of its
    own, runs on its own ids). ``drafter_options`` belongs to the drafter (:class:`NGramOptions`,
    :class:`CrossTokenizerOptions`, :class:`HybridOptions`, or a new drafter's own type).

    ``gamma_policy`` / ``gamma_threshold``: for ``generation.gamma_policies.make_policy``.
    ``processor``: a :class:`ProcessorSpec` or a built processor. ``seed``: seeds torch's global
    generator and a ``torch.Generator`` on the decoding device (None: nothing). ``target_delay_s``:
    an injected wait before every target forward (``/rtt_inject``). ``tree`` > 0: token trees of at most
    that many nodes (``tree_branch`` children per node; a model that cannot take one runs chains and
    says why); ``tree_sample``: under sampling, children drawn from q and verified by recursive
    rejection sampling. ``compile``: ``off``, ``static`` or ``graphs`` (``kvcache.static``; a refused
    model runs ``off`` and says why). ``inspect``: record the inspector's numbers per round.
    ``verify``: the chain rule, ``residual`` (Leviathan et al. / Chen et al.), ``block`` (Sun et al.
    2025) or ``strict``, all lossless. ``decisions``: under greedy, keep the target row that decided
    each token (``analysis.divergence``). ``max_rounds`` > 0 ends a drafting run after that many rounds.
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
