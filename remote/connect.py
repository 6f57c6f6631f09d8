"""A client for the server at a URL: the engines known (``KINDS``), which one answers, and ``connect``."""

from __future__ import annotations

from remote.dialect import ServerClient
from remote.llamacpp import LlamaCppClient
from remote.sglang import SglangClient
from remote.transport import Backoff, ServerError, Transport
from remote.vllm import VllmClient


KINDS: dict[str, type[ServerClient]] = {"llamacpp": LlamaCppClient, "vllm": VllmClient, "sglang": SglangClient}
# Named so that a user sees them refused in one line rather than as unknown words (none at present).
PLANNED: tuple[str, ...] = ()


def detect_kind(transport: Transport) -> str:
    """The engine behind ``transport``: llama.cpp answers ``/props`` with ``default_generation_settings``;
    vLLM and SGLang list their models as ``owned_by``; an SGLang that does not answers
    ``/get_model_info`` with ``model_path`` and ``is_generation``."""
    props = _get_or_empty(transport, "/props")
    if "default_generation_settings" in props:
        return "llamacpp"
    models = _get_or_empty(transport, "/v1/models")
    owners = {str(m.get("owned_by", "")).lower() for m in (models.get("data") or []) if isinstance(m, dict)}
    for kind in KINDS:
        if kind in owners:
            return kind
    if {"model_path", "is_generation"} <= set(_get_or_empty(transport, "/get_model_info")):
        return "sglang"
    raise ServerError(f"{transport.url} is neither a llama.cpp server (/props), a vLLM one (/v1/models owned by "
                      f"vllm) nor an SGLang one (/v1/models owned by sglang, /get_model_info): pass --server-kind "
                      f"({', '.join(KINDS)})")


def _get_or_empty(transport: Transport, path: str) -> dict:
    """``path``'s JSON object, or {} when the server has no such path (HTTP 404) or answers no object."""
    try:
        answer, _ = transport.get(path)
    except ServerError as e:
        if "HTTP 404" not in str(e):
            raise
        return {}
    return answer if isinstance(answer, dict) else {}


def connect(url: str, kind: str | None = None, backoff: Backoff = Backoff()) -> ServerClient:
    """A client for the server at ``url`` (``kind`` detected when None)."""
    transport = Transport(url, backoff)
    name = (kind or "").strip().lower() or detect_kind(transport)
    if name in PLANNED:
        raise ServerError(f"--server-kind {name}: not supported yet (supported: {', '.join(KINDS)})")
    if name not in KINDS:
        raise ServerError(f"--server-kind {name!r} is unknown (supported: {', '.join(KINDS)})")
    return KINDS[name](transport)
