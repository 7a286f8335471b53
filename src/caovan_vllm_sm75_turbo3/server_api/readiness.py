"""Waiting until a vLLM server can take requests: the port accepts, GET /health is 200, the model is listed.

vLLM binds its port early but listens only once the engine is up, so "connection refused" means
"not up yet" and we keep waiting (bounded by `wait_s`). A 503 from /health is vLLM's
EngineDeadError: the engine died and will not come back, so we stop at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import CaovanError
from .client import ServerClient
from .transport import Deadline, Misdirected, Refused, StepError, error_message

# Exit codes of a readiness failure: the server is not there / died, or the request names something wrong.
EXIT_NOT_READY = 3
EXIT_BAD_INPUT = 2
# A proxy (One-API, nginx) in front of a server that is still starting answers these.
_PROXY_NOT_UP = (502, 504)
_PROBE_TIMEOUT_S = 10.0


class NotReady(CaovanError):
    """The server will not take requests; `str()` is the reason, `exit_code` what the command exits with.

    A CaovanError: the user fixes it (start the server, wait longer, pass --api-key or --model).
    """

    def __init__(self, reason: str, exit_code: int = EXIT_NOT_READY) -> None:
        super().__init__(reason, exit_code=exit_code)


@dataclass(frozen=True)
class Ready:
    """A server that takes requests: the model to warm and what it told us about it."""

    model: str
    max_model_len: int | None
    waited_s: float


def wait_until_ready(client: ServerClient, model: str | None, wait_s: float, poll_s: float = 1.0,
                     on_wait: Callable[[str, float], None] | None = None) -> Ready:
    """Poll until the server is healthy and lists `model` (or exactly one model when `model` is None).

    `on_wait(what, elapsed_s)` is called after each poll that was not yet ready, with what we wait for.
    Raises NotReady when `wait_s` runs out, the engine is dead, the API key is refused, or the
    model is not served.
    """
    wait = Deadline.after(wait_s)
    refused_only = True   # every poll refused: nothing was started there (vLLM's port opens once it is up)
    while True:
        # One deadline for both probes, never past the wait: a server that trickles bytes ends with it.
        probe = Deadline.after(max(0.05, min(_PROBE_TIMEOUT_S, wait.left())))
        try:
            health = client.get("/health", probe)
        except Refused:
            what = (f"the port to accept connections (connection refused: nothing listens on {client.where} yet; "
                    "vLLM opens it once the engine is loaded)")
        except Misdirected as err:  # TLS to a plain-HTTP server, a request that cannot be sent: waiting won't help
            raise NotReady(str(err), EXIT_BAD_INPUT) from None
        except StepError as err:
            refused_only = False
            what = f"GET /health to answer ({err})"
        else:
            refused_only = False
            if health.status_code == 503:
                body = f" (body: {error_message(health.content)})" if health.content.strip() else ""
                raise NotReady(f"GET /health returned 503 at {client.api_base}: the engine is dead "
                               f"(vLLM EngineDeadError){body}; read the server log, restart it, then warm it up again")
            if health.status_code == 200:
                listed = _listed_model(client, model, probe)
                if listed is not None:
                    served, max_len = listed
                    return Ready(served, max_len, wait_s - wait.left())
                what = "GET /v1/models to answer"
            elif health.status_code in _PROXY_NOT_UP:
                what = f"GET /health to be 200 (a proxy answers {health.status_code}: the server is not up yet)"
            else:
                raise NotReady(f"GET /health returned {health.status_code} at {client.api_base}: "
                               f"{error_message(health.content)}; is this a vLLM server?")
        if on_wait:
            on_wait(what, wait_s - wait.left())
        if wait.left() <= 0:
            if refused_only:
                raise NotReady(f"nothing listens on {client.where}: connection refused for the whole {wait_s:g} s "
                               "wait. Is the server started, on this host and port? vLLM opens its port only once "
                               "the engine is up (a first start on SM75 compiles for minutes): raise --wait for a "
                               "cold start")
            raise NotReady(f"{client.api_base} not ready after {wait_s:g} s: still waiting for {what} "
                           "(raise --wait for a cold start)")
        time.sleep(min(poll_s, wait.left()))   # the last poll comes at the end of the wait, not a poll early


def _listed_model(client: ServerClient, model: str | None, probe: Deadline) -> tuple[str, int | None] | None:
    """The served model (name, max_model_len) from GET /v1/models; None when it did not answer yet."""
    try:
        resp = client.get("/v1/models", probe)
    except StepError:
        return None
    if resp.status_code == 401:
        raise NotReady("GET /v1/models returned 401 Unauthorized: pass --api-key (or set OPENAI_API_KEY / "
                       "VLLM_API_KEY) to the key the server was started with", EXIT_BAD_INPUT)
    if resp.status_code != 200:
        raise NotReady(f"GET /v1/models returned {resp.status_code}: {error_message(resp.content)}")
    try:
        cards = [c for c in resp.json()["data"] if isinstance(c, dict) and isinstance(c.get("id"), str)]
    except (ValueError, KeyError, TypeError):
        raise NotReady(f"GET /v1/models did not return a model list: {resp.content[:200]!r}") from None
    names = [c["id"] for c in cards]
    if model is None:
        if len(cards) == 1:
            card = cards[0]
        elif not cards:
            raise NotReady("GET /v1/models lists no model")
        else:
            raise NotReady(f"the server serves several models ({', '.join(names)}): choose one with --model",
                           EXIT_BAD_INPUT)
    else:
        matches = [c for c in cards if c["id"] == model]
        if not matches:
            raise NotReady(f"model {model!r} is not served by {client.api_base}; it serves: "
                           f"{', '.join(names) or 'nothing'} (use one of these with --model, "
                           "as given to --served-model-name)", EXIT_BAD_INPUT)
        card = matches[0]
    max_len = card.get("max_model_len")
    return card["id"], max_len if isinstance(max_len, int) else None
