"""Spec-Bench's published leaderboard, and what the machine model (``analysis.roofline``) makes of it.

Spec-Bench (hemingkx/Spec-Bench, ``Leaderboard.md``) ran eight methods on Vicuna-7B-v1.3, fp16,
greedy, batch 1, on an RTX 3090 and on an A100, and published each one's mean accepted tokens per
round (tau) and its overall speedup over plain decoding. A method's round is a verify forward of
the target over some tokens (a chain's gamma + 1, a tree's nodes + 1, lookahead's rows) and, for
some methods, forwards of a drafter beside it. Given tau, the model prices the round on a card:

    speedup = tau x T_step / (T_draft_round + T_verify(width))

with every T a ``MachineProfile.forward_s`` at batch 1 over a context of ``CONTEXT`` tokens and
T_step = T(1, 1, L). :func:`carried_speedup` instead starts from one card's published speedup and
carries the round's overhead to another card through the two profiles.

Every figure below is a fact of Spec-Bench's configuration or of a checkpoint's config, with where
it comes from. Plain numbers, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.roofline import MachineProfile, ModelShape

# -- The source -----------------------------------------------------------------------------------

REPOSITORY = "hemingkx/Spec-Bench"
LEADERBOARD_FILE = "Leaderboard.md"
# The revision whose tables hold these eight methods on both cards, all run under PyTorch 2.0.1
# ("typo fixed", 2024-10-25). Later revisions (from 6d56ad2, 2025-02) add Token Recycling and
# SAM-Decoding and re-run the 3090 table under PyTorch 2.5.1 with other figures.
LEADERBOARD_COMMIT = "09244ff33257f2cdde9422f0e382eba1f3b43a9e"
# The code read for each method's configuration: the same revision's evaluation/ and model/.
CODE_COMMIT = LEADERBOARD_COMMIT

CARDS = ("RTX3090", "A100")          # keys of analysis.roofline.PROFILES
METHODS = ("EAGLE2", "EAGLE", "SpS", "Hydra", "PLD", "Medusa", "REST", "Lookahead")

# (tau: "#Mean Accepted Tokens", overall speedup) for Vicuna-7B-v1.3, by card, as published.
# The 3090 table: one RTX 3090 (24 GB), 12 CPU cores, PyTorch 2.0.1, CUDA 11.8. The A100 table:
# one A100 (80 GB), 64 CPU cores, PyTorch 2.0.1, CUDA 11.4. EAGLE2 is on the 3090 table only.
LEADERBOARD: dict[str, dict[str, tuple[float, float]]] = {
    "RTX3090": {
        "EAGLE2": (4.36, 2.25), "EAGLE": (3.57, 2.16), "SpS": (2.29, 1.83), "Hydra": (3.26, 1.80),
        "PLD": (1.74, 1.55), "Medusa": (2.32, 1.44), "REST": (1.63, 1.32), "Lookahead": (1.65, 1.08),
    },
    "A100": {
        "EAGLE": (3.61, 2.29), "Hydra": (3.24, 2.09), "Medusa": (2.32, 1.78), "PLD": (1.73, 1.59),
        "SpS": (2.28, 1.49), "REST": (1.82, 1.48), "Lookahead": (1.66, 1.27),
    },
}


def source() -> str:
    return f"github.com/{REPOSITORY} {LEADERBOARD_FILE} at {LEADERBOARD_COMMIT[:7]}"


# -- Shapes ---------------------------------------------------------------------------------------
# ``parameters`` counts the weights a forward reads: every matrix except the input embedding, of
# which a forward reads only its tokens' rows (engine.shapes.model_shape counts it too, 2% here).

FP16 = 2           # bytes a weight (Spec-Bench runs --dtype float16 throughout)
HIDDEN = 4096      # Vicuna-7B-v1.3 = LLaMA-7B: 32 layers, hidden 4096, intermediate 11008,
INTERMEDIATE = 11008   # vocabulary 32000, 32 heads (no grouped KV), fp16
VOCAB = 32000
LAYERS = 32


def decoder_layer_parameters(hidden: int, intermediate: int) -> int:
    """A LLaMA decoder layer: q, k, v, o (4 h^2) and the gated MLP (3 h i); norms left out."""
    return 4 * hidden * hidden + 3 * hidden * intermediate


def llama_shape(layers: int, hidden: int, intermediate: int, vocab: int) -> ModelShape:
    """A LLaMA model in fp16: its decoder layers and LM head; keys and values of every layer."""
    return ModelShape(parameters=layers * decoder_layer_parameters(hidden, intermediate) + vocab * hidden,
                      weight_bytes=FP16, layers=layers, hidden=hidden,
                      kv_bytes_per_token=2 * layers * hidden * FP16, dtype="float16")


def heads_shape(parameters: int) -> ModelShape:
    """Weights applied token by token with no attention (Medusa's and Hydra's heads): no cache."""
    return ModelShape(parameters=parameters, weight_bytes=FP16, layers=0, hidden=HIDDEN,
                      kv_bytes_per_token=0, dtype="float16")


TARGET = llama_shape(LAYERS, HIDDEN, INTERMEDIATE, VOCAB)
# vicuna-68m (huggingface.co/double7/vicuna-68m config.json): 2 layers, hidden 768,
# intermediate 3072, 12 heads, vocabulary 32000 (eval.sh: Drafter_PATH=.../vicuna-68m).
VICUNA_68M = llama_shape(2, 768, 3072, VOCAB)
# EAGLE's drafter (EAGLE-Vicuna-7B-v1.3 config.json: 1 layer, hidden 4096, intermediate 11008):
# an fc from [feature; token embedding] (2h -> h) and one decoder layer of the target's width,
# then the target's own LM head (model/eagle/cnets.py); its own cache over the context.
EAGLE_DRAFTER = ModelShape(
    parameters=2 * HIDDEN * HIDDEN + decoder_layer_parameters(HIDDEN, INTERMEDIATE) + VOCAB * HIDDEN,
    weight_bytes=FP16, layers=1, hidden=HIDDEN, kv_bytes_per_token=2 * HIDDEN * FP16, dtype="float16")
# Medusa: evaluation/inference_medusa.py loads num_heads = 4; each head is one ResBlock (h x h with
# bias) and its own LM head (h x V), model/medusa/medusa_model.py. Run on every verified token.
MEDUSA_HEADS = heads_shape(4 * (HIDDEN * HIDDEN + HIDDEN + HIDDEN * VOCAB))
# Hydra++ (the Hydra README's recipe for ankner/hydra-vicuna-7b-v1.3: 4 heads, 4 layers a head,
# prefix-mlp, grounded): a prefix decoder layer of the target's width over the verified tokens,
# then head i's first block reads (i + 2) h inputs (a linear and a residual projection, each
# (i + 2) h x h), its shared h x h block is applied 3 more times, and its LM head (h x V):
# model/hydra/hydra_heads/prefix_mlp_head.py.
HYDRA_PREFIX = llama_shape(1, HIDDEN, INTERMEDIATE, 0)


def hydra_head(index: int) -> ModelShape:
    return heads_shape(2 * (index + 2) * HIDDEN * HIDDEN + 3 * HIDDEN * HIDDEN + HIDDEN * VOCAB)


# -- Rounds ---------------------------------------------------------------------------------------

ACCEPTED = 0   # a forward's width: the tokens the last round kept (tau, rounded; at least 1)


@dataclass(frozen=True)
class Forward:
    """Forwards a round makes beside the target's verify: ``count`` forwards of ``shape`` over
    ``width`` new tokens each. ``own`` is False for work done inside the verify forward (Medusa's
    heads): it adds bytes and FLOPs but no forward's overhead of its own."""

    what: str
    shape: ModelShape
    width: int
    count: int = 1
    own: bool = True


@dataclass(frozen=True)
class Round:
    """One method's round as Spec-Bench runs it: the target's ``verify_width`` (tokens a verify
    forward carries), the drafter's ``forwards``, ``lookup_s`` (host look-ups a round, seconds)
    and ``source`` (where each figure comes from)."""

    method: str
    verify_width: int
    forwards: tuple[Forward, ...] = ()
    lookup_s: float = 0.0
    source: str = ""


SPS_GAMMA = 5          # transformers 4.37.1 (requirements.txt) GenerationConfig.num_assistant_tokens
EAGLE_TREE_NODES = 25  # EAGLE's mc_sim_7b_63 (model/eagle/choices.py): 25 paths, depth 5
EAGLE2_TOTAL_TOKEN, EAGLE2_DEPTH, EAGLE2_TOP_K = 60, 5, 10   # evaluation/inference_eagle2.py defaults
MEDUSA_TREE_NODES = 63  # Medusa's and Hydra's mc_sim_7b_63: 63 paths, depth 4
PLD_CANDIDATES = 10    # evaluation/inference_pld.py: draft_num_candidate_tokens=10, n-gram up to 3
REST_DRAFT = 64        # evaluation/inference_rest.py --num-draft 64 (max suffix 16)
LADE_LEVEL, LADE_WINDOW, LADE_GUESS = 5, 7, 7   # eval.sh: --level 5 --window 7 --guess 7

ROUNDS: dict[str, Round] = {r.method: r for r in (
    Round("SpS", SPS_GAMMA + 1,
          (Forward("vicuna-68m, the tokens kept", VICUNA_68M, ACCEPTED),
           Forward("vicuna-68m, one token", VICUNA_68M, 1, SPS_GAMMA - 1)),
          source="model/sps/decoding.py: transformers' assisted generation; the drafter's generate() "
                 "makes gamma forwards, gamma starts at 5 and moves by the 'heuristic' schedule "
                 "(+2 when all drafts pass, -1 otherwise); priced at 5"),
    Round("EAGLE", EAGLE_TREE_NODES + 1,
          (Forward("EAGLE layer + LM head, the tokens kept", EAGLE_DRAFTER, ACCEPTED),)
          + tuple(Forward(f"EAGLE layer + LM head, tree depth {d + 1}", EAGLE_DRAFTER, w)
                  for d, w in enumerate((4, 4, 1, 1))),
          source="model/eagle/cnets.py topK_genrate: one forward over the kept tokens, then one per "
                 "tree level whose nodes have children (4, 4, 1, 1 of mc_sim_7b_63); verify 25 + 1"),
    Round("EAGLE2", EAGLE2_TOTAL_TOKEN,
          (Forward("EAGLE layer + LM head, the tokens kept", EAGLE_DRAFTER, ACCEPTED),
           Forward("EAGLE layer + LM head, top-k expansion", EAGLE_DRAFTER, EAGLE2_TOP_K, EAGLE2_DEPTH)),
          source="evaluation/inference_eagle2.py --total-token 60 --depth 5 --top-k 10; "
                 "model/eagle2/cnets.py: 59 drafted + the sampled token verified, depth forwards of top_k"),
    Round("Medusa", MEDUSA_TREE_NODES + 1,
          (Forward("4 Medusa heads on the verified tokens", MEDUSA_HEADS, MEDUSA_TREE_NODES + 1, own=False),),
          source="evaluation/inference_medusa.py: num_heads = 4, --medusa-choices mc_sim_7b_63; the "
                 "heads run inside the verify forward (model/medusa/medusa_model.py forward)"),
    Round("Hydra", MEDUSA_TREE_NODES + 1,
          (Forward("Hydra prefix layer, the tokens kept", HYDRA_PREFIX, ACCEPTED),)
          + tuple(Forward(f"Hydra head {i}", hydra_head(i), w) for i, w in enumerate((1, 10, 10, 1))),
          source="evaluation/inference_hydra.py --hydra-choices mc_sim_7b_63; prefix_mlp_head.py "
                 "_grounded_proposal: the prefix layer, then head i over the tree's expanded nodes "
                 "of depth i (1, 10, 10, 1)"),
    Round("PLD", PLD_CANDIDATES + 1,
          source="model/pld/pld.py: a match of the last 3..1 tokens in the context proposes 10; "
                 "the look-up (a tensor compare on the GPU) is left out: 0 s; a round with no "
                 "match verifies 1 token, priced as a full one"),
    Round("REST", REST_DRAFT + 1,
          source="evaluation/inference_rest.py: a tree of up to 64 drafts (+ the root) from the "
                 "suffix-array datastore (model/rest/DraftRetriever lib.rs, draft_len = choices + 1); "
                 "no published look-up time for datastore_chat_large: 0 s"),
    Round("Lookahead", 1 + (LADE_LEVEL - 1) * LADE_WINDOW - 1 + LADE_GUESS * (LADE_LEVEL - 1),
          source="model/lade/decoding.py, models/llama.py jforward_multilevel: the current token, "
                 "the window's N - 1 rows of W (the first one token short: 6 + 3 x 7) and G guesses "
                 "of N - 1 (7 x 4): 56 at most, no drafter model"),
)}

# -- The context ----------------------------------------------------------------------------------
# Spec-Bench's 480 questions average about 1,200 characters in their first turn (summarization and
# RAG about 3,000, QA 50); with Vicuna's system prompt and template about 1,400 characters, about
# 350 LLaMA tokens at 4 characters a token. Answers are capped at 1,024 new tokens; Spec-Bench
# publishes no mean length, and about 300 is taken (an assumption). Mid-answer: 350 + 150 = 500.
# At batch 1 the context is a small share of a forward's bytes (0.5 MB a token against 13 GB of
# weights), so the choice moves a prediction by about 1% between 128 and 2,048 tokens.
CONTEXT = 500


# -- Pricing --------------------------------------------------------------------------------------

def forward_width(width: int, tau: float) -> int:
    return max(1, round(tau)) if width == ACCEPTED else width


def step_s(profile: MachineProfile, context: int = CONTEXT) -> float:
    """Target AR's step: one token over the context."""
    return profile.forward_s(TARGET, 1, 1, context)


def draft_s(profile: MachineProfile, rnd: Round, tau: float, context: int = CONTEXT) -> float:
    """The round's work beside the verify: its drafter forwards and its look-ups."""
    total = rnd.lookup_s
    for f in rnd.forwards:
        one = profile.forward_s(f.shape, 1, forward_width(f.width, tau), context)
        total += f.count * (one if f.own else one - profile.overhead_for(f.shape))
    return total


def round_s(profile: MachineProfile, rnd: Round, tau: float, context: int = CONTEXT) -> float:
    return draft_s(profile, rnd, tau, context) + profile.forward_s(TARGET, 1, rnd.verify_width, context)


def predicted_speedup(profile: MachineProfile, rnd: Round, tau: float, context: int = CONTEXT) -> float:
    """tau x T_step / (T_draft_round + T_verify(width))."""
    return tau * step_s(profile, context) / round_s(profile, rnd, tau, context)


def overhead_steps(profile: MachineProfile, rnd: Round, tau: float, context: int = CONTEXT) -> float:
    """What the model says a round costs beyond one target step, in target steps on ``profile``."""
    return round_s(profile, rnd, tau, context) / step_s(profile, context) - 1.0


def carried_speedup(rnd: Round, tau_from: float, speedup_from: float, card_from: MachineProfile,
                    card_to: MachineProfile, tau_to: float | None = None, context: int = CONTEXT) -> float:
    """One card's published speedup carried to another card through the two profiles.

    On the first card a round took tau / speedup target steps (speedup = tau x step / round), so
    beyond one target step it took o = tau / speedup - 1 steps: the drafter, the wider verify and
    whatever else (host work) the round pays. The model prices the same round on each card, in that
    card's own target steps: x = T_round / T_step - 1 (:func:`overhead_steps`). The overhead is
    carried in that proportion, o' = o x x_to / x_from, and the second card's speedup is
    tau_to / (1 + o'), ``tau_to`` (the second card's own acceptance) defaulting to ``tau_from``.
    The same profile on both sides gives back the first card's speedup exactly; a round the model
    prices at no overhead on the first card (x_from = 0) keeps its overhead unchanged.
    """
    tau_to = tau_from if tau_to is None else tau_to
    observed = tau_from / speedup_from - 1.0
    x_from = overhead_steps(card_from, rnd, tau_from, context)
    x_to = overhead_steps(card_to, rnd, tau_from, context)
    carried = observed if x_from <= 0 else observed * x_to / x_from
    return tau_to / (1.0 + carried)


# -- The comparison -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One method on one card: ``tau`` and ``published`` speedup, the ``predicted`` one and its
    signed ``error`` (predicted / published - 1)."""

    method: str
    tau: float
    published: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1.0

    def to_dict(self) -> dict:
        return {"method": self.method, "tau": self.tau, "published": self.published,
                "predicted": round(self.predicted, 4), "error_pct": round(100 * self.error, 2)}


def mean_abs_error(rows: list[Row]) -> float:
    return sum(abs(r.error) for r in rows) / len(rows) if rows else math.nan


def card_rows(card: str, profile: MachineProfile, context: int = CONTEXT,
              rounds: dict[str, Round] = ROUNDS) -> list[Row]:
    """Every method Spec-Bench published on ``card``, predicted from its tau on ``profile``."""
    return [Row(m, tau, speed, predicted_speedup(profile, rounds[m], tau, context))
            for m, (tau, speed) in LEADERBOARD[card].items()]


def carried_rows(card_from: str, card_to: str, profile_from: MachineProfile, profile_to: MachineProfile,
                 context: int = CONTEXT, rounds: dict[str, Round] = ROUNDS) -> list[Row]:
    """Every method published on both cards: the second card's speedup carried from the first's."""
    rows = []
    for m, (tau_to, speed_to) in LEADERBOARD[card_to].items():
        if m not in LEADERBOARD[card_from]:
            continue
        tau_from, speed_from = LEADERBOARD[card_from][m]
        rows.append(Row(m, tau_to, speed_to, carried_speedup(rounds[m], tau_from, speed_from, profile_from,
                                                             profile_to, tau_to, context)))
    return rows
