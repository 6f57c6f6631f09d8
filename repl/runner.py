"""Run every enabled strategy on one prompt, the same way each time.

The runner owns what a prompt needs besides the settings: the model pair, the
n-gram storage (kept between prompts unless ``reset_in_between`` is on) and
the warm-up. It never prints: it hands each finished strategy to a callback
(the renderer), so printing is outside every timer, and returns a
:class:`repl.runs.PromptRun` that the comparison table, the JSON output and
trace files read.
"""

from __future__ import annotations

import gc
from typing import Callable

import torch

from generation import (
    ContextLengthError,
    GenerationResult,
    autoregressive_generate,
    speculative_generate,
)
from ngram_assisted import NGramStorage, OneLevelNGramStorage, ngram_assisted_speculative_generate
from repl.runs import PromptRun, StrategyRun  # noqa: F401  (the runner's products, torch-free)
from repl.settings import ProcessorSpec, Settings
from utils.devices import model_device
from utils.vocab import encode_prompt, has_chat_template

STORAGE_CLASSES = {"basic": NGramStorage, "onelevel": OneLevelNGramStorage}
WARMUP_TEXT = "Hello, how are you?"
MODEL_POLICY_MAX_GAMMA = 16  # the most drafts the model policy considers (more when /gamma is higher)


class PromptRefused(ValueError):
    """The prompt cannot run as asked (empty, or too long for the context)."""


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Runner:
    """Runs prompts on a loaded model pair (a ``utils.models.ModelPair``)."""

    def __init__(self, pair, notify: Callable[[str], None] = lambda message: None):
        self.pair = pair
        self.notify = notify
        self._storage = None
        self._storage_key: tuple[str, int] | None = None
        self._told_no_template = False
        self._policies: dict[str, tuple] = {}  # strategy key -> ((name, gamma, threshold), policy)

    # ------------------------------------------------------------ prompt -> ids

    def encode(self, text: str, settings: Settings) -> list[int]:
        """Token ids for ``text``, through the chat template when chat is on."""
        tokenizer = self.pair.tokenizer
        if settings.chat and not has_chat_template(tokenizer) and not self._told_no_template:
            self._told_no_template = True
            self.notify("this tokenizer has no chat template: prompts are used as raw text")
        return encode_prompt(tokenizer, text, chat=settings.chat)

    def check_fits(self, ids: list[int], settings: Settings) -> None:
        """Raise PromptRefused when the prompt and the length budget do not fit."""
        if not ids:
            raise PromptRefused("the prompt encodes to no tokens")
        limit = self.pair.context_length
        if limit is not None and len(ids) + settings.length > limit:
            raise PromptRefused(
                f"prompt refused: {len(ids)} prompt tokens + {settings.length} new tokens = "
                f"{len(ids) + settings.length}, more than the context of {limit} tokens "
                f"(at most {max(limit - len(ids), 0)} new tokens fit; lower /length)"
            )

    # ------------------------------------------------------------------ storage

    def storage(self, settings: Settings):
        """The n-gram storage of the configured kind and N (rebuilt when they change)."""
        key = (settings.ngram_storage, settings.ngram_n)
        if self._storage is None or key != self._storage_key:
            cls = STORAGE_CLASSES[settings.ngram_storage]
            self._storage = cls(settings.ngram_n, self.pair.vocab_size)
            self._storage_key = key
        return self._storage

    # ------------------------------------------------------------------ running

    def warm_up(self) -> None:
        """One short run per model and one speculative run, so the first timed
        strategy does not pay for lazy initialisation."""
        settings = Settings(length=4, gamma=2, chat=False)
        ids = self.pair.tokenizer(WARMUP_TEXT).input_ids or [0]
        processor = ProcessorSpec().build()
        for key in ("target", "drafter", "speculative"):
            self._generate(key, ids, settings, processor, trace=False, interruptible=False)

    def _generator(self, key: str, seed: int) -> torch.Generator:
        model = self.pair.drafter if key == "drafter" else self.pair.target
        return torch.Generator(device=model_device(model)).manual_seed(seed)

    def gamma_policy(self, settings: Settings, key: str = "speculative"):
        """The draft-length policy object for strategy ``key``.

        One policy per strategy is kept across prompts, so a policy that learns
        (heuristic, model) carries what it learned to the next prompt, as
        transformers' assisted generation does; changing /gamma_policy or /gamma
        starts a fresh one. ``model`` chooses among 0..max(/gamma, 16) drafts.
        """
        from generation.gamma_policy import make_policy

        threshold = settings.gamma_threshold if settings.gamma_policy == "confidence" else None
        gamma = max(settings.gamma, MODEL_POLICY_MAX_GAMMA) if settings.gamma_policy == "model" else settings.gamma
        spec = (settings.gamma_policy, gamma, threshold)
        kept = self._policies.get(key)
        if kept is None or kept[0] != spec:
            kept = self._policies[key] = (spec, make_policy(*spec))
        return kept[1]

    def _generate(self, key: str, ids: list[int], settings: Settings, processor,
                  *, trace: bool, interruptible: bool = True) -> GenerationResult:
        pair = self.pair
        torch.manual_seed(settings.seed)
        common = dict(
            logits_processor=processor, max_gen_len=settings.length, eos_tokens_id=pair.end_tokens,
            use_cache=settings.cache, generator=self._generator(key, settings.seed),
            trace=trace, interruptible=interruptible,
        )
        if key == "speculative":
            return speculative_generate(ids, pair.drafter, pair.target, gamma=settings.gamma,
                                        vocab_size=pair.vocab_size, **common,
                                        gamma_policy=self.gamma_policy(settings, key))
        if key == "ngram":
            storage = self.storage(settings)
            return ngram_assisted_speculative_generate(
                ids, storage, pair.target, gamma=settings.gamma,
                filler_top_k=settings.top_k_filler, **common,
                gamma_policy=self.gamma_policy(settings, key),
            )
        if key == "target":
            return autoregressive_generate(ids, pair.target, **common)
        return autoregressive_generate(ids, pair.drafter, phase="draft", **common)

    def run_strategy(self, key: str, ids: list[int], settings: Settings, processor) -> StrategyRun:
        """One strategy, with its failures turned into an error line."""
        run = StrategyRun(key)
        try:
            # The rounds are always kept: /stats, the speedup model and traces read them.
            run.result = self._generate(key, ids, settings, processor, trace=True)
        except ContextLengthError as e:
            run.error = f"refused: {e}"
        except Exception as e:  # a failing strategy must not end the session
            if is_out_of_memory(e):
                free_memory()
                run.error = (f"out of memory on {self.pair.device}: "
                             "lower /length or /gamma, or use a smaller model")
            else:
                run.error = f"failed: {type(e).__name__}: {e}"
        else:
            run.text = self.pair.tokenizer.decode(run.result.tokens, skip_special_tokens=True)
        return run

    def prepare(self, text: str, settings: Settings) -> PromptRun:
        """Encode ``text`` and check it fits; raises PromptRefused otherwise."""
        ids = self.encode(text, settings)
        self.check_fits(ids, settings)
        return PromptRun(text, ids, greedy=settings.processor.is_greedy, settings=settings.to_dict())

    def run(self, prompt_run: PromptRun, settings: Settings,
            on_run: Callable[[PromptRun, StrategyRun], None] = lambda prompt_run, run: None) -> PromptRun:
        """Run each enabled strategy in order on a prepared prompt.

        The n-gram storage is emptied first when ``reset_in_between`` is on.
        A Ctrl-C ends the current strategy (its partial output is kept, marked
        interrupted) and skips the rest.
        """
        processor = settings.processor.build()
        if settings.reset_in_between:
            self.storage(settings).reset()
        try:
            for key in settings.enabled_strategies():
                run = self.run_strategy(key, prompt_run.prompt_ids, settings, processor)
                prompt_run.runs.append(run)
                on_run(prompt_run, run)
                if run.result is not None and run.result.interrupted:
                    prompt_run.interrupted = True
                    break
        except KeyboardInterrupt:
            prompt_run.interrupted = True
        return prompt_run
