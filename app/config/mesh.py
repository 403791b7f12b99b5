"""Mesh settings: peers, voters, timing profiles. Owned by app/coordination/p2p.

Timing profiles are named bundles of intervals. They are kept together because the safety of
the election depends on their relations (lease < election timeout, heartbeat well under the
lease), which `TimingProfile` checks when it is built.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from app.config.base import StrictModel


class TimingProfile(StrictModel):
    """Every interval the mesh uses, in seconds."""

    heartbeat_interval: float  # leader -> peers
    gossip_interval: float
    gossip_fanout: int = 3
    suspect_after: float  # no news from a peer for this long -> SUSPECT
    dead_after: float  # ... and for this long -> DEAD
    election_timeout_min: float  # follower waits at least this long without a leader
    election_timeout_spread: float  # random extra wait in [0, spread)
    rank_step: float  # extra wait per bully-rank position (lower priority waits longer)
    leader_lease: float  # leader steps down without quorum acks for this long
    request_timeout: float  # one node-to-node HTTP request
    bully_patience: float  # how long voters insist on the highest-ranked alive candidate
    claim_ttl: float = 30.0  # default work-claim TTL
    reconcile_interval: float = 1.0  # how often the leader rebuilds its queue
    detection_aim: float = 3.0  # targets the fault tests and bench_mesh.py hold the profile to
    failover_aim: float = 5.0

    @model_validator(mode="after")
    def _lease_shorter_than_election_timeout(self) -> TimingProfile:
        if not self.leader_lease < self.election_timeout_min:
            raise ValueError("leader_lease must be shorter than election_timeout_min")
        if not self.heartbeat_interval * 2 <= self.leader_lease:
            raise ValueError("heartbeat_interval must be at most half of leader_lease")
        if not self.suspect_after < self.dead_after:
            raise ValueError("suspect_after must be shorter than dead_after")
        if self.gossip_fanout < 1:
            raise ValueError("gossip_fanout must be >= 1")
        return self


PROFILES: dict[str, TimingProfile] = {
    # Aims: failure detection <= 3 s, failover <= 5 s.
    "lan": TimingProfile(
        heartbeat_interval=0.4,
        gossip_interval=0.5,
        suspect_after=1.6,
        dead_after=6.0,
        election_timeout_min=1.8,
        election_timeout_spread=0.6,
        rank_step=0.1,
        leader_lease=1.4,
        request_timeout=0.8,
        bully_patience=6.0,
        claim_ttl=60.0,
        reconcile_interval=2.0,
        detection_aim=3.0,
        failover_aim=5.0,
    ),
    # Aims: failure detection <= 10 s, failover <= 15 s (Tailscale across sites).
    "wan": TimingProfile(
        heartbeat_interval=1.5,
        gossip_interval=1.5,
        suspect_after=6.0,
        dead_after=20.0,
        election_timeout_min=7.0,
        election_timeout_spread=2.0,
        rank_step=0.3,
        leader_lease=5.0,
        request_timeout=3.0,
        bully_patience=25.0,
        claim_ttl=300.0,
        reconcile_interval=5.0,
        detection_aim=10.0,
        failover_aim=15.0,
    ),
    # For tests on loaded loopback machines: fast but not so fast that a busy CPU flaps.
    "fast": TimingProfile(
        heartbeat_interval=0.15,
        gossip_interval=0.2,
        suspect_after=0.8,
        dead_after=3.0,
        election_timeout_min=1.0,
        election_timeout_spread=0.4,
        rank_step=0.05,
        leader_lease=0.8,
        request_timeout=0.5,
        bully_patience=3.0,
        claim_ttl=5.0,
        reconcile_interval=0.5,
        detection_aim=1.5,  # generous for loaded 2-core test machines
        failover_aim=4.0,
    ),
}


class TlsConfig(StrictModel):
    """Cluster CA and this node's certificate and key (`python -m app.coordination.p2p.tls init`).
    As `mesh.tls` they are the TLS certificate and sign every message; as `mesh.node_keys` they
    only sign (plain HTTP). Either way a peer's node id is the one its certificate names."""

    ca_file: Path
    cert_file: Path
    key_file: Path


class MeshLimits(StrictModel):
    """What one node accepts from the network before it refuses (hostile or broken peers)."""

    max_peers: int = Field(default=1024, ge=8)  # peer table; configured peers always fit
    peer_evict_after: float | None = Field(default=None, gt=0)  # unknown peer silent this long: dropped (10 x dead_after)
    header_deadline: float = Field(default=10.0, gt=0)  # a connection's request headers, from open or last answer
    body_deadline: float = Field(default=10.0, gt=0)  # a request's body once its headers arrived
    max_connections: int = Field(default=512, ge=8)  # open connections in all
    max_connections_per_addr: int = Field(default=256, ge=2)  # ... from one address (loopback clusters share one)
    keepalive_timeout: float = Field(default=15.0, gt=0)  # an idle kept-alive connection is closed
    clock_window_s: float = Field(default=10.0, gt=0, le=300)  # a signed timestamp this far off ours is refused
    max_term_step: int = Field(default=1000, ge=16, le=2**20)  # a term adopted at most this far above every other voter's
    read_bufsize: int = Field(default=16384, ge=1024, le=2**20)  # bytes buffered per connection before it is read


class MeshConfig(StrictModel):
    peers: list[str] = []  # "host:port" or "node_id@host:port" (the latter pins that id's address)
    voters: list[str] = []  # node ids; empty = this node alone is the only voter
    profile: str = "lan"
    priority: int = 0  # bully order: higher priority, then higher node id, is preferred
    secret: str | None = None  # prefer env MESH_SECRET or MESH_SECRET_FILE over this
    secret_file: Path | None = None
    tailscale: bool = False  # also discover peers from `tailscale status --json`
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    max_attempts: int = Field(default=3, ge=1)  # work item attempts before it is given up
    timing: TimingProfile | None = None  # full override of the named profile
    limits: MeshLimits = Field(default_factory=MeshLimits)
    tls: TlsConfig | None = None  # off: plain HTTP (on networks already encrypted, e.g. Tailscale)
    node_keys: TlsConfig | None = None  # per-node signing keys without TLS; off (and no tls): the shared secret

    @model_validator(mode="after")
    def _known_profile(self) -> MeshConfig:
        if self.timing is None and self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; expected one of {sorted(PROFILES)}")
        if self.tls is not None and self.node_keys is not None:
            raise ValueError("set mesh.tls or mesh.node_keys, not both: with TLS the certificate's key signs")
        return self

    def key_files(self) -> TlsConfig | None:
        """The per-node key this node signs with (TLS's, or node_keys'); None: the shared secret."""
        return self.tls if self.tls is not None else self.node_keys

    def timing_profile(self) -> TimingProfile:
        return self.timing if self.timing is not None else PROFILES[self.profile]
