"""A target behind a serving engine.

``transport``: JSON over HTTP with bounded retries and request times; ``dialect``: what every
engine's client shares; one client per engine (``llamacpp``, ``vllm``, ``sglang``); ``connect``:
the client for a URL (the engine detected or named); ``rules``: what is exact from top-N
log-probabilities; ``target``: the served target and its session.
"""
