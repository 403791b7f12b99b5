"""HTTP API of a mesh node (port 8770).

Operator endpoints, readable without a signature: GET /status, /progress, /mesh/hello (who answers
here, for signing), /metrics (Prometheus text of the node's registry).
Node-to-node endpoints, signed (auth.py): POST /gossip, /vote, /heartbeat, /commit, /commit/read, /commit/decided,
/transfer/timeout_now, /admin/transfer (operator: hand leadership over),
/work/claim, /work/claim_training, /work/renew, /work/complete (with the claimant's signed
completion: completions.py), /work/fail.

Every body is parsed with bounded size and depth; anything malformed is a 400 with a reason,
never a 500; no answer is ever non-JSON (jsonwire.py). Every answer to a request that carried a
nonce is signed by this node (answers.py). Each message must come from the node it speaks for (the signed sender: a gossip's
sender, a vote's candidate, a claim's node; the leader checks are consensus_core.admit). Token
operations on a stale claim get 409; a claim sent to a node that cannot hand out work (not
leader, no lease, quorum LOST) gets 503 with the leader it knows of, so the worker can retry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ValidationError

from app.config.mesh import MeshLimits
from app.coordination.p2p.answers import answer_headers
from app.coordination.p2p.auth import (
    BODY_KEY,
    BOOT_HEADER,
    FROM_HEADER,
    ID_RE,
    NODE_HEADER,
    NONCE_HEADER,
    SENDER_KEY,
    Verifier,
    auth_middleware,
    json_error,
)
from app.coordination.p2p.completions import request_problem, sign_grant
from app.coordination.p2p.conn_guard import ConnectionGuard
from app.coordination.p2p.consensus import Consensus
from app.coordination.p2p.identity import Identity
from app.coordination.p2p.jsonwire import BadJson, dumps
from app.coordination.p2p.jsonwire import parse_json as parse_json_text
from app.coordination.p2p.membership import Membership, decode
from app.coordination.p2p.quorum_cert import verifier_of
from app.coordination.p2p.refusals import Refusals
from app.coordination.p2p.schemas import (
    ClaimRequest,
    ClaimResponse,
    CommitReadRequest,
    CommitRequest,
    GossipMessage,
    HeartbeatRequest,
    TimeoutNowRequest,
    TokenRequest,
    TokenResponse,
    TransferRequest,
    VoteRequest,
)
from app.coordination.p2p.work_queue import WorkQueue
from app.coordination.p2p.work_rules import TRAINING_KIND, TRAINING_KINDS
from app.log import get_logger

log = get_logger(__name__)
M = TypeVar("M", bound=BaseModel)
PUBLIC = [("GET", "/status"), ("GET", "/progress"), ("GET", "/mesh/hello"), ("GET", "/metrics")]


class ServedNode(Protocol):
    """What the API needs of a node (MeshNode provides it)."""

    node_id: str
    boot: int
    identity: Identity
    max_body_bytes: int
    limits: MeshLimits
    consensus: Consensus
    membership: Membership
    queue: WorkQueue
    refusals: Refusals
    registry: CollectorRegistry
    progress_provider: Callable[[], Any] | None
    wall_clock: Callable[[], float]

    @property
    def term(self) -> int: ...
    @property
    def is_leader(self) -> bool: ...
    @property
    def leader_id(self) -> str | None: ...
    def addr_of(self, node_id: str) -> str | None: ...
    def status(self) -> dict[str, Any]: ...
    def absorb(self, message: GossipMessage, direct: str | None = None) -> None: ...
    def gossip_message(self) -> GossipMessage: ...
    def cert_id_of(self, request: web.Request) -> str | None: ...


class BadRequest(Exception):
    pass


def parse_json(raw: bytes) -> Any:
    """JSON with bounded depth, finite numbers and bounded integer digits; BadRequest otherwise."""
    try:
        return parse_json_text(raw)
    except BadJson as exc:
        raise BadRequest(f"body is {exc}") from None


def parse_body(request: web.Request, model: type[M]) -> M:
    data = parse_json(request.get(BODY_KEY, b""))
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<body>'}: {e['msg']}" for e in exc.errors()[:10]
        )
        raise BadRequest(f"invalid {model.__name__}: {problems}"[:2000]) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise BadRequest(f"invalid {model.__name__}: {str(exc)[:500]}") from None


def sender_of(request: web.Request) -> str:
    return request.get(SENDER_KEY, "")


def same_sender(request: web.Request, claimed: str, what: str) -> None:
    """The message must come from the node it speaks for."""
    sender = sender_of(request)
    if sender != claimed:
        raise BadRequest(f"{what} is {claimed} but the request was signed by {sender}")


def ok(model: BaseModel | dict[str, Any], status: int = 200) -> web.Response:
    text = model.model_dump_json() if isinstance(model, BaseModel) else dumps(model)
    return web.Response(status=status, text=text, content_type="application/json")


def error_middleware(refusals: Refusals):  # type: ignore[no-untyped-def]
    """Typed errors become JSON answers; nothing leaks a traceback to the client."""

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as exc:
            refusals.refused_in(sender_of(request) or request.remote or "?", "bad_request", str(exc)[:300])
            return json_error(400, str(exc), code="bad_request")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return json_error(exc.status, exc.reason)
            raise
        except Exception:
            log.exception("request failed", path=request.path)
            return json_error(500, "internal error")

    return middleware


def build_app(
    node: ServedNode, guard: ConnectionGuard, extra_routes: Iterable[web.RouteDef] = (),
    extra_public: Iterable[tuple[str, str]] = (),
) -> web.Application:
    verifier = Verifier(node.identity, node.node_id, node.boot, window=node.limits.clock_window_s,
                        clock=node.wall_clock)
    public = {(m.upper(), p) for m, p in [*PUBLIC, *extra_public]}
    app = web.Application(
        middlewares=[
            guard.middleware(), error_middleware(node.refusals),
            auth_middleware(verifier, node.max_body_bytes, public, body_deadline=node.limits.body_deadline,
                            cert_id_of=node.cert_id_of, on_refused=node.refusals.refused_in),
        ],
        client_max_size=node.max_body_bytes,
    )

    async def who_answers(request: web.Request, response: web.StreamResponse) -> None:
        """Sign the answer (answers.py) for the node that asked: the proven sender, or on a public
        endpoint the one the request names. An unauthenticated refusal stays unsigned."""
        response.headers[NODE_HEADER] = node.node_id
        response.headers[BOOT_HEADER] = str(node.boot)
        asker = request.get(SENDER_KEY)
        if asker is None and (request.method, request.path) in public:
            claimed = request.headers.get(FROM_HEADER)
            asker = claimed if claimed and ID_RE.match(claimed) else None
        nonce = request.headers.get(NONCE_HEADER)
        if asker is None or not nonce or len(nonce) > 128:
            return
        body = response.body if isinstance(response, web.Response) and isinstance(response.body, bytes) else None
        response.headers.update(answer_headers(node.identity, node.node_id, node.boot, asker, nonce, response.status,
                                               body, node.wall_clock(), method=request.method, path=request.path))

    app.on_response_prepare.append(who_answers)
    c = node.consensus
    verify = verifier_of(node.identity)  # a claimant's signed completion (completions.py)

    async def status(request: web.Request) -> web.Response:
        return ok(node.status())

    async def hello(request: web.Request) -> web.Response:
        return ok({"node_id": node.node_id, "boot": node.boot})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(node.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def progress(request: web.Request) -> web.Response:
        data = node.progress_provider() if node.progress_provider else {"generations": []}
        return ok(data)

    async def gossip(request: web.Request) -> web.Response:
        msg = parse_body(request, GossipMessage)
        same_sender(request, msg.sender, "the gossip's sender")
        for i, envelope in enumerate(msg.states):
            try:
                decode(envelope)
            except ValueError as exc:
                raise BadRequest(f"states.{i}: {exc}") from None
        node.absorb(msg, direct=msg.sender)
        return ok(node.gossip_message())

    async def vote(request: web.Request) -> web.Response:
        return ok(c.handle_vote(sender_of(request), parse_body(request, VoteRequest)))

    async def heartbeat(request: web.Request) -> web.Response:
        return ok(c.handle_heartbeat(sender_of(request), parse_body(request, HeartbeatRequest)))

    def answered(handler, schema, refused):  # type: ignore[no-untyped-def]
        """A voter-side handler of the decision/transfer protocols: 200, or 409 when it refused."""
        async def endpoint(request: web.Request) -> web.Response:
            resp = handler(sender_of(request), parse_body(request, schema))
            return ok(resp, 409 if refused(resp) else 200)
        return endpoint

    commit = answered(c.handle_store, CommitRequest, lambda r: not r.stored)
    commit_decided = answered(c.handle_decided, CommitRequest, lambda r: not r.stored)
    commit_read = answered(c.handle_read, CommitReadRequest, lambda r: not r.ok)
    timeout_now = answered(c.handle_timeout_now, TimeoutNowRequest, lambda r: not r.ok)

    async def transfer(request: web.Request) -> web.Response:
        req = parse_body(request, TransferRequest)
        if not node.is_leader:
            return elsewhere("not the leader")
        why = await c.transfer_leadership(req.target, node.membership.alive_ids(time.monotonic()))
        if why is not None:
            return ok({"error": why}, 409)
        return ok({"transferred_to": req.target, "from_term": node.term})

    def elsewhere(why: str) -> web.Response:
        """503 naming the leader this node knows of, so the caller can retry there."""
        return ok({"error": why, "leader": node.leader_id,
                   "leader_addr": node.addr_of(node.leader_id) if node.leader_id else None}, 503)

    def not_serving() -> web.Response | None:
        if not c.can_mutate():
            return elsewhere("not the leader" if not node.is_leader else "no quorum (read-only)")
        return None

    async def claim_common(request: web.Request, training_only: bool) -> web.Response:
        req = parse_body(request, ClaimRequest)
        same_sender(request, req.node_id, "the claim's node_id")
        refused = not_serving()
        if refused is not None:
            return refused
        kinds = [TRAINING_KIND] if training_only else req.kinds
        if training_only and req.kinds:  # e.g. a joiner asking for training_join items only
            kinds = [k for k in req.kinds if k in TRAINING_KINDS]
        grant = node.queue.claim(req.node_id, req.capabilities, kinds, node.term, time.monotonic())
        if grant is None:
            return ok(ClaimResponse(status="no_work"))
        return ok(ClaimResponse(status="claimed", item=grant.item, token=grant.token, ttl=grant.ttl,
                                election=c.election_cert,
                                grant=sign_grant(node.identity, grant.token, grant.item.item_id, req.node_id)))

    async def claim(request: web.Request) -> web.Response:
        return await claim_common(request, training_only=False)

    async def claim_training(request: web.Request) -> web.Response:
        return await claim_common(request, training_only=True)

    async def renew(request: web.Request) -> web.Response:
        req = parse_body(request, TokenRequest)
        same_sender(request, req.node_id, "the claim's node_id")
        reason, ttl, token = node.queue.renew_token(
            req.node_id, req.item_id, req.token, node.term, c.can_mutate(), time.monotonic()
        )
        if reason is not None:
            return ok(TokenResponse(ok=False, reason=reason), 409)
        moved = token is not None and token != req.token  # an adopted claim's new token: grant it
        return ok(TokenResponse(ok=True, ttl=ttl, token=token,
                                grant=sign_grant(node.identity, token, req.item_id, req.node_id) if moved else ""))

    def finish(success: bool):  # type: ignore[no-untyped-def]
        async def handler(request: web.Request) -> web.Response:
            req = parse_body(request, TokenRequest)
            same_sender(request, req.node_id, "the claim's node_id")
            problem = request_problem(verify, req) if success else None  # work completes only so
            reason = node.queue.finish(
                req.node_id, req.item_id, req.token, node.term, c.can_mutate(),
                time.monotonic(), ok=success, error=req.error, completion=req.completion,
                completion_problem=problem[1] if problem else None,
            )
            if reason is not None and problem is not None and reason == problem[1]:
                node.refusals.refused_in(req.node_id, problem[0], f"/work/complete of {req.item_id[:128]}: {reason}")
                return ok(TokenResponse(ok=False, reason=reason), 401 if problem[0] != "completion_mismatch" else 400)
            if reason is not None:
                return ok(TokenResponse(ok=False, reason=reason), 409)
            return ok(TokenResponse(ok=True))

        return handler

    app.add_routes([
        web.get("/status", status),
        web.get("/mesh/hello", hello),
        web.get("/metrics", metrics),
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
