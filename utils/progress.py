"""Loading feedback for the terminal: one rich spinner, and no tqdm bars from the HF libraries.

Library code reports through a ``progress(str)`` callable and never prints; the REPL turns that
callable into a spinner line with ``loading_status``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

Progress = Callable[[str], None]


def no_progress(_message: str) -> None:
    """A progress callback that shows nothing."""


def quiet_hf_progress() -> None:
    """Turn off the tqdm bars of transformers and huggingface_hub (they fight the REPL's display)."""
    import huggingface_hub.utils
    import transformers.utils.logging

    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()


@contextlib.contextmanager
def quiet_hf_warnings() -> Iterator[None]:
    """Lower transformers' log level to errors for the duration of a load, then restore it."""
    import transformers.utils.logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


@contextlib.contextmanager
def loading_status(console, message: str = "Loading models…") -> Iterator[Progress]:
    """Show a rich spinner on ``console`` while models load; yields the ``progress`` callback for
    ``engine.load_pair``."""
    with console.status(message, spinner="dots") as status:
        yield lambda text: status.update(text)
