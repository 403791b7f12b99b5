"""MeshNode: one node of the mesh: membership and gossip, the election (via Consensus), the
leader's work queue, and the HTTP API, wired together with a few periodic loops.

Its boot incarnation (bumped and persisted at every start) is what signed requests name as the
receiver's boot, so nothing signed for an earlier run of this node is accepted by this one.
Its identity (identity.py) is its own key when `mesh.node_keys` or `mesh.tls` is set, else the
cluster's shared secret (the quick start, which the log says trusts every holder)."""

from __future__ import annotations

import asyncio
import inspect
import random
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from app.config import ConfigError, Settings
from app.config.mesh import PROFILES, TimingProfile
from app.coordination.p2p.auth import load_identity
from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.completions import CompletionBook
from app.coordination.p2p.conn_guard import ConnectionGuard, raise_descriptor_limit, rate_limit_loop_errors
from app.coordination.p2p.consensus import Consensus
from app.coordination.p2p.discovery import TailscaleSource, parse_peer_list
from app.coordination.p2p.election import QuorumLevel, Role
from app.coordination.p2p.gossip import Gossiping
from app.coordination.p2p.identity import Identity, NodeKey
from app.coordination.p2p.membership import Liveness, Membership
from app.coordination.p2p.node_status import default_capabilities, node_status
from app.coordination.p2p.persist import CommitStore, HistoryLog, TermStore
from app.coordination.p2p.refusals import Refusals
from app.coordination.p2p.schemas import Completion, NodeState
from app.coordination.p2p.server import build_app
from app.coordination.p2p.tls import (
    cert_node_id,
    client_context,
    server_context,
)
from app.coordination.p2p.view import ClusterView, WorkSource
from app.coordination.p2p.work_queue import WorkQueue
from app.coordination.p2p.worker import WorkClient
from app.log import get_logger

log = get_logger(__name__)
RELAY_STEP = 64  # shared secret: how far a relayed state may raise a node's incarnation (membership.py)
LINGER_S = 1.0  # after a refusal, the rest of an unread body is read (and dropped) this long, then the connection closes


class MeshNode(Gossiping):
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        node_id: str | None = None,
        host: str | None = None,
        port: int | None = None,
        data_dir: str | Path | None = None,
        peers: list[str] | str | None = None,
        voters: list[str] | str | None = None,
        priority: int | None = None,
        profile: str | None = None,
        timing: TimingProfile | None = None,
        secret: str | bytes | Identity | None = None,
        tailscale: bool | None = None,
        work_source: WorkSource | None = None,
        capabilities: dict[str, Any] | None = None,
        registry: CollectorRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`registry`: the node's Prometheus registry (refusal counts land there; a private one
        when None). `wall_clock`: the clock signed timestamps are made and checked with."""
        s = settings or Settings()
        mesh = s.mesh
        self.node_id = node_id or s.node.node_id
        self.host = host or s.node.host
        self.port = s.node.mesh_port if port is None else port
        self.data_dir = Path(data_dir if data_dir is not None else s.node.data_dir)
        self.db_url = s.node.db_url  # the work queue's database, when not a file under data_dir
        if isinstance(voters, str):
            voters = [v for v in voters.split(",") if v]
        self.voters = sorted(set(voters if voters is not None else mesh.voters))
        self.priority = mesh.priority if priority is None else priority
        if timing is not None:
            self.timing = timing
        elif profile is not None:
            if profile not in PROFILES:
                raise ValueError(f"unknown profile {profile!r}; expected one of {sorted(PROFILES)}")
            self.timing = PROFILES[profile]
        else:
            self.timing = mesh.timing_profile()
        peer_addrs = parse_peer_list(peers if peers is not None else mesh.peers)
        if not self.voters:
            if peer_addrs or mesh.tailscale:
                # Each node defaulting to "I am the only voter" would make every node a leader.
                raise ConfigError("mesh.voters (or --voters) must list the voter node ids when peers are configured")
            self.voters = [self.node_id]
        self.pinned = {p.node_id: p.addr for p in peer_addrs if p.node_id}
        self.seeds = [p.addr for p in peer_addrs if not p.node_id]
        self.seed_ids: dict[str, str] = {}  # seed addr -> node id that answered there
        self.max_body_bytes = mesh.max_body_bytes
        self.max_attempts = mesh.max_attempts
        self.limits, self.tls, self.wall_clock = mesh.limits, mesh.tls, wall_clock
        self.identity = self._identity(mesh, secret, clustered=bool(peer_addrs) or len(self.voters) > 1)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.refusals = Refusals(self.registry)
        self.boot = 0  # set at start(): the persisted incarnation of this run
        self.tailscale = TailscaleSource(self.port) if (mesh.tailscale if tailscale is None else tailscale) else None
        self.work_source = work_source
        self.progress_provider: Callable[[], Any] | None = None
        self._initial_capabilities = capabilities if capabilities is not None else default_capabilities()
        self._extra_routes: list[web.RouteDef] = []
        self._public_routes: list[tuple[str, str]] = []
        self._tasks: list[asyncio.Task] = []
        self._gossip_in_flight: set[str] = set()
        self.completions = CompletionBook(self.identity, self.refusals)  # work completes only by these
        self._bg: set[asyncio.Task] = set()
        self._rng = random.Random()
        self._runner: web.AppRunner | None = None
        self.started = False

    def _identity(self, mesh: Any, secret: str | bytes | Identity | None, clustered: bool) -> Identity:
        """Our own key (mesh.node_keys / mesh.tls: its certificate must name this node), else the
        shared secret: `secret`, the environment or the config; a lone node may generate one."""
        if secret is not None and not isinstance(secret, (str, bytes)) and mesh.key_files() is None:
            return secret
        identity = load_identity(mesh, secret if isinstance(secret, (str, bytes)) else None, self.data_dir,
                                 allow_generate=not clustered)
        if isinstance(identity, NodeKey) and identity.node_id != self.node_id:
            raise ConfigError(f"{mesh.key_files().cert_file}: the certificate names {identity.node_id}, "
                              f"this node is {self.node_id}")
        return identity

    # -- extension points ------------------------------------------------------------
    def add_routes(self, routes: Iterable[web.RouteDef], public: Iterable[tuple[str, str]] = ()) -> None:
        """Extra endpoints from other layers; signed unless listed in `public` (method, path).
        Call before start()."""
        self._extra_routes.extend(routes)
        self._public_routes.extend(public)

    def set_progress_provider(self, fn: Callable[[], Any]) -> None:
        self.progress_provider = fn

    def set_work_source(self, fn: WorkSource | None) -> None:
        self.work_source = fn

    def update_local_state(self, **fields: Any) -> None:
        """Change what this node gossips (capabilities, inventory, claims, ...)."""
        allowed = {"capabilities", "inventory", "claims"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"update_local_state: unknown fields {sorted(unknown)}; allowed {sorted(allowed)}")
        self.membership.update_local(**fields)

    # -- reading ---------------------------------------------------------------------
    @property
    def term(self) -> int:
        return self.consensus.term

    @property
    def role(self) -> Role:
        return self.consensus.role

    @property
    def is_leader(self) -> bool:
        return self.consensus.role is Role.LEADER

    @property
    def leader_id(self) -> str | None:
        return self.consensus.leader_id

    @property
    def quorum_level(self) -> QuorumLevel:
        return self.consensus.quorum_level()

    @property
    def addr(self) -> str:
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.gethostname()
        return f"{host}:{self.port}"

    def addr_of(self, node_id: str) -> str | None:
        if node_id == self.node_id:
            return self.addr
        seed = self.pinned.get(node_id) or next((a for a, sid in self.seed_ids.items() if sid == node_id), None)
        state = self.membership.state_of(node_id) if seed is None else None
        return seed or (state.addr if state and state.addr else None)

    def cluster_view(self) -> ClusterView:
        now = time.monotonic()
        m = self.membership
        return ClusterView(
            self_id=self.node_id, term=self.term, leader=self.leader_id,
            nodes={s.node_id: s for s in m.states()},
            liveness={nid: m.liveness(nid, now) for nid in [m.node_id, *m.peers]},
        )

    def work_client(self) -> WorkClient:
        """A WorkClient for this node whose held claims are gossiped with our state; it looks for
        the leader through us and the credible peers (membership.py)."""
        def addrs() -> list[str]:
            m, now = self.membership, time.monotonic()
            return [self.addr] + [a for a in (self.addr_of(n) for n in m.peers if m.credible(n, now)) if a]
        return WorkClient(
            self.client, self.node_id, addrs=addrs,
            capabilities=lambda: dict(self.membership.local.capabilities),
            on_claims_changed=lambda claims: self.membership.update_local(claims=claims),
            leader_proof=lambda who, term, cert: self.consensus.election_refusal(term, who, cert),
            on_completed=self._completed_here,
        )

    def _completed_here(self, completion: Completion) -> None:
        """A completion this node signed as a claimant: gossiped, so a new leader admits it."""
        self.completions.add_own(completion)
        self.completions.publish(self.membership)

    async def decide(self, key: str, proposal: str | None) -> str | None:
        """Leader only: the value decided for `key` through a quorum (deciding.py): `proposal`,
        or what an earlier leader decided or half-stored; None without a quorum."""
        return await self.consensus.decide(key, proposal)

    async def commit(self, key: str, value: str) -> bool:
        """Leader only: True once `value` is the decided value of `key`."""
        return await self.decide(key, value) == value

    def decided_for_gossip(self, prefixes: tuple[str, ...], limit: int) -> list[dict[str, Any]]:
        """The newest decided values under `prefixes`, each with its decision certificate."""
        return self.consensus.decided_for_gossip(prefixes, limit)

    def learn_decided(self, peer: str, entries: Any) -> list[str]:
        """Take the decided values `peer` passed on whose certificates check; the keys learned."""
        return self.consensus.learn_entries(peer, entries)

    def stored_value(self, key: str) -> str | None:
        """What this voter stored for `key`: tentative (never to be acted on) unless a quorum
        stored it too; the decided ones are in `commits.decided_values()`."""
        return self.commits.get(key)

    def cert_id_of(self, request: web.Request) -> str | None:
        """With TLS on: the node id the peer's certificate names (its requests must say the same)."""
        if self.tls is None or request.transport is None:
            return None
        return cert_node_id(request.transport.get_extra_info("peercert"))

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = TermStore(self.data_dir / "mesh_term.json")
        incarnation = self.boot = self.store.next_incarnation()
        self.commits = CommitStore(self.data_dir / "mesh_commits.json")
        self.history = HistoryLog(self.data_dir / "mesh_history.jsonl", self.node_id)
        self.queue = WorkQueue(self.db_url or self.data_dir / "work_queue.db", self.max_attempts, self.timing.claim_ttl)
        self.client = MeshClient(self.identity, self.timing.request_timeout, node_id=self.node_id,
                                 ssl_context=client_context(self.tls) if self.tls else None,
                                 refusals=self.refusals, clock=self.wall_clock)
        now = time.monotonic()
        local = NodeState(
            node_id=self.node_id, addr="", incarnation=incarnation, priority=self.priority,
            voter=self.node_id in self.voters, capabilities=self._initial_capabilities,
            term=self.store.term,
        )
        self.membership = Membership(
            local, self.timing.suspect_after, self.timing.dead_after, now, known=[*self.voters, *self.pinned],
            max_peers=self.limits.max_peers, evict_after=self.limits.peer_evict_after,
            message_budget=self.max_body_bytes * 3 // 4, sign=self.identity.sign,
            relay_step=RELAY_STEP if self.identity.mode == "shared" else None,
        )
        self.consensus = Consensus(
            self.node_id, self.voters, self.priority, self.timing, self.store, self.commits,
            self.history, self.membership, self.client, self.addr_of, self._on_become_leader,
            max_term_step=self.limits.max_term_step,
            on_term_refused=lambda peer, term, why: self.refusals.refused_in(peer, "term_far_ahead", why),
            on_refused=self.refusals.refused_in,
        )
        raise_descriptor_limit()
        rate_limit_loop_errors(asyncio.get_running_loop())
        guard = ConnectionGuard(self.limits.max_connections_per_addr, self.limits.max_connections,
                                self.limits.header_deadline, on_refused=self.refusals.refused_in)
        self.app = build_app(self, guard, self._extra_routes, self._public_routes)
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self.limits.keepalive_timeout,
                                     read_bufsize=self.limits.read_bufsize, lingering_time=LINGER_S)
        await self._runner.setup()
        assert self._runner.server is not None
        guard.install(self._runner.server)
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True,
                           ssl_context=server_context(self.tls) if self.tls else None, backlog=256)
        await site.start()
        if self.port == 0:
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.membership.local = self.membership.local.model_copy(update={"addr": self.addr})
        self.history.append("started", self.term, addr=self.addr, incarnation=incarnation)
        log.info("mesh node started", addr=self.addr, voters=self.voters, term=self.term, auth=self.identity.mode)
        if self.identity.mode == "shared" and len(self.voters) + len(self.pinned) + len(self.seeds) > 1:
            log.warning("mesh_auth_shared_secret", detail="every holder of the cluster secret can sign as any node; "
                        "issue per-node keys (python -m app.coordination.p2p.tls init) and set mesh.node_keys or mesh.tls")
        self.started = True
        t = self.timing
        for loop in (self.consensus.lag.run(), self._every(t.gossip_interval, self.gossip_round, "gossip round"),
                     self._election_loop(),
                     self._every(t.heartbeat_interval, self.consensus.heartbeat_round, "heartbeat round"),
                     self._every(t.reconcile_interval, self.reconcile, "reconcile")):
            self._tasks.append(asyncio.create_task(loop))
        if self.tailscale is not None:
            self._tasks.append(asyncio.create_task(self._discovery_loop()))

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        for task in self._tasks + list(self._bg):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._bg, return_exceptions=True)
        await self.consensus.cancel_tasks()
        if self.is_leader:
            self.consensus.step_down("shutdown")
        if self._runner is not None:
            await self._runner.cleanup()
        await self.client.close()
        self.queue.close()
        self.history.append("stopped", self.term)

    # -- loops -----------------------------------------------------------------------
    async def _election_loop(self) -> None:
        tick = self.timing.heartbeat_interval / 2
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if self.consensus.role is Role.LEADER:
                self.consensus.check_step_down(now)
            elif self.consensus.is_voter and self.consensus.election_due(now):  # less our own stalls
                try:
                    await self.consensus.run_election()
                except Exception:
                    log.exception("election failed")
                self.consensus.reset_election_deadline(time.monotonic())

    async def _every(self, interval: float, step: Callable[[], object], what: str) -> None:
        """Run `step` (sync or async) every `interval` s; one failure must not end the loop."""
        while True:
            try:
                result = step()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception(f"{what} failed")
            await asyncio.sleep(interval)

    def reconcile(self) -> None:
        if not self.consensus.can_mutate():
            return
        view = self.cluster_view()
        specs = list(self.work_source(view)) if self.work_source is not None else None
        now = time.monotonic()
        # a finisher only suspected (a loaded node's late heartbeat) may still gossip its result:
        # only a dead one's is taken as gone, so no shard is played twice for a stall
        present = {nid for nid, live in view.liveness.items() if live is not Liveness.DEAD}
        for item in self.queue.reconcile(specs, now, alive=present):
            log.info("work_item_reopened", item=item[:200], why="its finisher is dead and its result was never seen")
        self.queue.adopt(self.term, self.completions.proven_claims(view.live_claims(), self.consensus.certified), now)
        self._admit_completions(view, now)

    def _admit_completions(self, view: ClusterView, now: float) -> None:
        """Leader: admit the claimants' completions gossip carries (completions.py), then gossip
        the newest this queue admitted."""
        self.completions.admit_gossiped(self.queue, view, self.term, self.consensus.certified, now)
        self.completions.publish(self.membership)

    def _on_become_leader(self, term: int) -> None:
        """Level-triggered rebuild: void old-term claims, fold in gossip, reconcile."""
        view = self.cluster_view()
        specs = list(self.work_source(view)) if self.work_source is not None else None
        in_flight = [c for s in view.nodes.values() for c in s.claims]
        try:
            live = self.completions.proven_claims(view.live_claims(), self.consensus.certified)
            self.queue.rebuild(term, specs, in_flight, time.monotonic(), live=live)
            self._admit_completions(view, time.monotonic())
        except Exception:
            log.exception("queue rebuild failed")
        self._sync_local()
        task = asyncio.ensure_future(self.consensus.heartbeat_round())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _discovery_loop(self) -> None:
        assert self.tailscale is not None
        while self.tailscale.enabled:
            for peer in await self.tailscale.peers():
                if peer.addr not in self.seeds and peer.addr != self.addr:
                    self.seeds.append(peer.addr)
            await asyncio.sleep(max(30.0, self.timing.dead_after))

    # -- status ----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return node_status(self)
