"""HTTP API of a mesh node (port 8770).

Operator endpoints, readable without a signature: GET /status, GET /progress.
Node-to-node endpoints, HMAC-signed: POST /gossip, /vote, /heartbeat, /commit, /commit/read, /commit/decided,
/transfer/timeout_now, /admin/transfer (operator: hand leadership over),
/work/claim, /work/claim_training, /work/renew, /work/complete, /work/fail.
Malformed bodies get 400 with a message; token operations on a stale claim get 409; a claim
sent to a node that cannot hand out work (not leader, no lease, quorum LOST) gets 503 with the
leader it knows of, so the worker can retry there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from app.coordination.p2p.auth import BODY_KEY, Verifier, auth_middleware, json_error
from app.coordination.p2p.schemas import (
    ClaimRequest,
    ClaimResponse,
    CommitReadRequest,
    CommitRequest,
    GossipMessage,
    HeartbeatRequest,
    TokenRequest,
    TimeoutNowRequest,
    TokenResponse,
    TransferRequest,
    VoteRequest,
)
from app.coordination.p2p.decision import handle_decided, handle_read, handle_store
from app.coordination.p2p.transfer import handle_timeout_now, transfer_leadership
from app.coordination.p2p.work_rules import TRAINING_KIND, TRAINING_KINDS
from app.log import get_logger

if TYPE_CHECKING:
    from app.coordination.p2p.node import MeshNode

log = get_logger(__name__)
M = TypeVar("M", bound=BaseModel)
PUBLIC = [("GET", "/status"), ("GET", "/progress")]


class BadRequest(Exception):
    pass


def parse_body(request: web.Request, model: type[M]) -> M:
    raw = request.get(BODY_KEY, b"")
    try:
        data = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<body>'}: {e['msg']}" for e in exc.errors()[:10]
        )
        raise BadRequest(f"invalid {model.__name__}: {problems}") from None


def ok(model: BaseModel | dict[str, Any], status: int = 200) -> web.Response:
    text = model.model_dump_json() if isinstance(model, BaseModel) else json.dumps(model)
    return web.Response(status=status, text=text, content_type="application/json")


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Typed errors become JSON answers; nothing leaks a traceback to the client."""
    try:
        return await handler(request)
    except BadRequest as exc:
        return json_error(400, str(exc))
    except web.HTTPException as exc:
        if exc.status >= 400:
            return json_error(exc.status, exc.reason)
        raise
    except Exception:  # noqa: BLE001 - logged here, never sent to the client
        log.exception("request failed", path=request.path)
        return json_error(500, "internal error")


def build_app(
    node: "MeshNode", extra_routes: Iterable[web.RouteDef] = (), extra_public: Iterable[tuple[str, str]] = ()
) -> web.Application:
    verifier = Verifier(node.secret)
    app = web.Application(
        middlewares=[error_middleware, auth_middleware(verifier, node.max_body_bytes, [*PUBLIC, *extra_public])],
        client_max_size=node.max_body_bytes,
    )

    async def status(request: web.Request) -> web.Response:
        return ok(node.status())

    async def progress(request: web.Request) -> web.Response:
        data = node.progress_provider() if node.progress_provider else {"generations": []}
        return ok(data)

    async def gossip(request: web.Request) -> web.Response:
        msg = parse_body(request, GossipMessage)
        node.absorb(msg)
        return ok(node.membership.message(time.monotonic()))

    async def vote(request: web.Request) -> web.Response:
        return ok(node.consensus.handle_vote(parse_body(request, VoteRequest)))

    async def heartbeat(request: web.Request) -> web.Response:
        return ok(node.consensus.handle_heartbeat(parse_body(request, HeartbeatRequest)))

    def answered(handler, schema, refused):  # type: ignore[no-untyped-def]
        """A voter-side handler of the decision/transfer protocols: 200, or 409 when it refused."""
        async def endpoint(request: web.Request) -> web.Response:
            resp = handler(node.consensus, parse_body(request, schema))
            return ok(resp, 409 if refused(resp) else 200)
        return endpoint

    commit = answered(handle_store, CommitRequest, lambda r: not r.stored)
    commit_decided = answered(handle_decided, CommitRequest, lambda r: not r.stored)
    commit_read = answered(handle_read, CommitReadRequest, lambda r: not r.ok)
    timeout_now = answered(handle_timeout_now, TimeoutNowRequest, lambda r: not r.ok)

    async def transfer(request: web.Request) -> web.Response:
        req = parse_body(request, TransferRequest)
        if not node.is_leader:
            return elsewhere("not the leader")
        why = await transfer_leadership(node.consensus, req.target, node.membership.alive_ids(time.monotonic()))
        if why is not None:
            return ok({"error": why}, 409)
        return ok({"transferred_to": req.target, "from_term": node.term})

    def elsewhere(why: str) -> web.Response:
        """503 naming the leader this node knows of, so the caller can retry there."""
        return ok({"error": why, "leader": node.leader_id,
                   "leader_addr": node.addr_of(node.leader_id) if node.leader_id else None}, 503)

    def not_serving() -> web.Response | None:
        if not node.consensus.can_mutate():
            return elsewhere("not the leader" if not node.is_leader else "no quorum (read-only)")
        return None

    async def claim_common(request: web.Request, training_only: bool) -> web.Response:
        req = parse_body(request, ClaimRequest)
        refused = not_serving()
        if refused is not None:
            return refused
        kinds = [TRAINING_KIND] if training_only else req.kinds
        if training_only and req.kinds:  # e.g. a joiner asking for training_join items only
            kinds = [k for k in req.kinds if k in TRAINING_KINDS]
        grant = node.queue.claim(req.node_id, req.capabilities, kinds, node.term, time.time())
        if grant is None:
            return ok(ClaimResponse(status="no_work"))
        return ok(ClaimResponse(status="claimed", item=grant.item, token=grant.token, ttl=grant.ttl))

    async def claim(request: web.Request) -> web.Response:
        return await claim_common(request, training_only=False)

    async def claim_training(request: web.Request) -> web.Response:
        return await claim_common(request, training_only=True)

    async def renew(request: web.Request) -> web.Response:
        req = parse_body(request, TokenRequest)
        reason, ttl = node.queue.renew(
            req.node_id, req.item_id, req.token, node.term, node.consensus.can_mutate(), time.time()
        )
        if reason is not None:
            return ok(TokenResponse(ok=False, reason=reason), 409)
        return ok(TokenResponse(ok=True, ttl=ttl))

    def finish(success: bool):  # type: ignore[no-untyped-def]
        async def handler(request: web.Request) -> web.Response:
            req = parse_body(request, TokenRequest)
            reason = node.queue.finish(
                req.node_id, req.item_id, req.token, node.term, node.consensus.can_mutate(),
                time.time(), ok=success, error=req.error,
            )
            if reason is not None:
                return ok(TokenResponse(ok=False, reason=reason), 409)
            return ok(TokenResponse(ok=True))

        return handler

    app.add_routes([
        web.get("/status", status),
        web.get("/progress", progress),
        web.post("/gossip", gossip),
        web.post("/vote", vote),
        web.post("/heartbeat", heartbeat),
        web.post("/commit", commit),
        web.post("/commit/read", commit_read),
        web.post("/commit/decided", commit_decided),
        web.post("/transfer/timeout_now", timeout_now),
        web.post("/admin/transfer", transfer),
        web.post("/work/claim", claim),
        web.post("/work/claim_training", claim_training),
        web.post("/work/renew", renew),
        web.post("/work/complete", finish(True)),
        web.post("/work/fail", finish(False)),
        *extra_routes,
    ])
    return app
