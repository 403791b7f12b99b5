"""Which daemons exist, how they are configured, and the contract every runner follows.

The code supplies a runner table (name -> runner, default settings, optional health check);
daemons.yaml decides which of them run, on which roles, with which settings. Both are
checked together at load time so that a typo, an unknown daemon, a missing dependency or a
dependency cycle stops the node at start-up with a message naming the file and the key,
instead of surfacing later as a daemon that silently never starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from pydantic import BaseModel, Field, ValidationError, create_model

from app.config import ConfigError, Settings, StrictModel, format_validation_error, read_yaml_mapping

if TYPE_CHECKING:
    from app.coordination.daemons.event_router import EventRouter
    from app.coordination.daemons.metrics import Metrics


S = TypeVar("S", bound=BaseModel)


class NoSettings(StrictModel):
    """A runner that takes no settings."""


@dataclass(eq=False)
class DaemonContext(Generic[S]):
    """What a runner gets. A runner returns when `stopping` is set; raising means it crashed."""

    name: str
    settings: S  # this daemon's settings, typed: its runner's schema, validated from daemons.yaml
    router: EventRouter
    app_settings: Settings
    stopping: asyncio.Event
    log: Any  # structlog logger bound to daemon=name
    metrics: Metrics
    on_healthy: Callable[[], None] | None = None
    last_heartbeat: float | None = field(default=None)  # monotonic seconds

    def mark_healthy(self) -> None:
        """Heartbeat: 'I made progress'. The first call also releases dependents waiting to start."""
        self.last_heartbeat = time.monotonic()
        if self.on_healthy is not None:
            self.on_healthy()

    def heartbeat_age(self) -> float | None:
        return None if self.last_heartbeat is None else time.monotonic() - self.last_heartbeat

    async def sleep(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking early on stop; True when the daemon should stop."""
        try:
            await asyncio.wait_for(self.stopping.wait(), timeout=max(0.0, seconds))
        except TimeoutError:
            pass
        return self.stopping.is_set()


Runner = Callable[[DaemonContext], Awaitable[None]]
HealthCheck = Callable[[DaemonContext], "bool | Awaitable[bool]"]


class RunnerEntry(NamedTuple):
    runner: Runner
    # the settings daemons.yaml may set: a schema (each key with its one default), or, for a
    # small runner, a mapping of keys to defaults that becomes one
    defaults: Mapping[str, Any] | type[BaseModel] = NoSettings
    health: HealthCheck | None = None


class RestartPolicy(StrictModel):
    base_s: float = Field(1.0, gt=0)
    cap_s: float = Field(300.0, gt=0)
    reset_after_s: float = Field(600.0, gt=0)  # this long up -> the backoff starts over
    crash_loop_starts: int = Field(5, ge=1)  # this many starts within the window -> give up
    crash_loop_window_s: float = Field(60.0, gt=0)


class DaemonEntry(StrictModel):
    """One daemon's block in daemons.yaml."""

    enabled: bool = True
    roles: list[str] = ["all"]  # node roles (settings.node.role) that run this daemon
    depends_on: list[str] = []
    critical: bool = False  # giving up on it makes /readyz 503
    health_interval_s: float = Field(5.0, gt=0)
    heartbeat_timeout_s: float | None = Field(None, gt=0)  # None: no heartbeat check
    start_timeout_s: float = Field(30.0, gt=0)  # dependents wait this long for its first heartbeat
    stop_timeout_s: float = Field(10.0, gt=0)
    restart: RestartPolicy | None = None  # keys given here override the file-level policy
    settings: dict[str, Any] = {}


class DaemonsFile(StrictModel):
    restart: RestartPolicy = RestartPolicy()
    daemons: dict[str, DaemonEntry] = {}


@dataclass(frozen=True)
class DaemonSpec:
    name: str
    runner: Runner
    enabled: bool = True
    roles: frozenset[str] = frozenset({"all"})
    depends_on: tuple[str, ...] = ()
    critical: bool = False
    health_interval_s: float = 5.0
    heartbeat_timeout_s: float | None = None
    start_timeout_s: float = 30.0
    stop_timeout_s: float = 10.0
    restart: RestartPolicy = RestartPolicy()
    settings: BaseModel = field(default_factory=NoSettings)
    health: HealthCheck | None = None

    def runs_on(self, role: str) -> bool:
        return self.enabled and role in self.roles


class DependencyCycleError(ValueError):
    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = list(cycle)
        super().__init__("dependency cycle: " + " -> ".join(self.cycle))


def topo_order(deps: Mapping[str, Sequence[str]]) -> list[str]:
    """Names ordered so every name comes after its dependencies; ties keep mapping order.

    Every dependency must itself be a key. Raises DependencyCycleError naming one cycle.
    """
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise DependencyCycleError(path[path.index(name):] + [name])
        state[name] = 1
        for dep in deps[name]:
            visit(dep, path + [name])
        state[name] = 2
        order.append(name)

    for name in deps:
        visit(name, [])
    return order


class DaemonRegistry:
    """All configured daemons (in dependency order) and the ones a node role runs."""

    def __init__(self, specs: Sequence[DaemonSpec], source: str = "<daemons>") -> None:
        self.source = source
        by_name = {s.name: s for s in specs}
        for spec in specs:
            for dep in spec.depends_on:
                if dep not in by_name:
                    raise ConfigError(f"{source}: daemons.{spec.name}.depends_on: unknown daemon {dep!r}")
        try:
            order = topo_order({s.name: s.depends_on for s in specs})
        except DependencyCycleError as exc:
            raise ConfigError(f"{source}: daemons.{exc.cycle[0]}.depends_on: {exc}") from None
        self.specs: dict[str, DaemonSpec] = {name: by_name[name] for name in order}

    def select(self, role: str) -> list[DaemonSpec]:
        """Enabled daemons for `role`, dependencies first. A selected daemon whose dependency
        is not selected (disabled, or another role) is a configuration error."""
        chosen = [s for s in self.specs.values() if s.runs_on(role)]
        names = {s.name for s in chosen}
        for spec in chosen:
            for dep in spec.depends_on:
                if dep not in names:
                    why = "is disabled" if not self.specs[dep].enabled else f"does not run on role {role!r}"
                    raise ConfigError(f"{self.source}: daemons.{spec.name}.depends_on: {dep!r} {why}")
        return chosen


def parse_daemons(data: Mapping[str, Any] | DaemonsFile, source: str = "<daemons>") -> DaemonsFile:
    """A parsed daemons.yaml, checked for its own keys (each daemon's settings: `build_registry`)."""
    if isinstance(data, DaemonsFile):
        return data
    try:
        return DaemonsFile.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(f"{source}: {format_validation_error(exc)}") from None


def daemon_settings(data: DaemonsFile, name: str, schema: type[S], source: str = "<daemons>") -> S:
    """Daemon `name`'s settings validated by `schema` (its defaults when the file names no such
    daemon): for what the node must know before its runners exist (the export threshold)."""
    entry = data.daemons.get(name)
    settings = _merge_settings(name, schema, entry.settings if entry is not None else {}, source)
    assert isinstance(settings, schema)
    return settings


def build_registry(
    data: Mapping[str, Any] | DaemonsFile, runners: Mapping[str, RunnerEntry | tuple], source: str = "<daemons>"
) -> DaemonRegistry:
    """Validate a parsed daemons.yaml against the runner table and build the registry."""
    parsed = parse_daemons(data, source)
    table = {name: RunnerEntry(*entry) for name, entry in runners.items()}
    specs = []
    for name, entry in parsed.daemons.items():
        if name not in table:
            known = ", ".join(sorted(table)) or "none"
            raise ConfigError(f"{source}: daemons.{name}: unknown daemon (known: {known})")
        runner = table[name]
        restart = parsed.restart
        if entry.restart is not None:
            restart = restart.model_copy(update=entry.restart.model_dump(exclude_unset=True))
        specs.append(
            DaemonSpec(
                name=name,
                runner=runner.runner,
                enabled=entry.enabled,
                roles=frozenset(entry.roles),
                depends_on=tuple(entry.depends_on),
                critical=entry.critical,
                health_interval_s=entry.health_interval_s,
                heartbeat_timeout_s=entry.heartbeat_timeout_s,
                start_timeout_s=entry.start_timeout_s,
                stop_timeout_s=entry.stop_timeout_s,
                restart=restart,
                settings=_merge_settings(name, runner.defaults, entry.settings, source),
                health=runner.health,
            )
        )
    return DaemonRegistry(specs, source)


def _merge_settings(
    name: str, defaults: Mapping[str, Any] | type[BaseModel], given: Mapping[str, Any], source: str
) -> BaseModel:
    """The runner's schema validating the file's keys: a key it does not declare is an error."""
    schema = defaults if isinstance(defaults, type) else _schema_of(name, defaults)
    try:
        return schema.model_validate(dict(given))
    except ValidationError as exc:
        raise ConfigError(f"{source}: daemons.{name}.settings: {format_validation_error(exc)}") from None


def _schema_of(name: str, defaults: Mapping[str, Any]) -> type[BaseModel]:
    """A mapping of keys to defaults as a strict schema (each key typed by its default)."""
    if not defaults:
        return NoSettings
    fields: dict[str, Any] = {key: (type(value), value) for key, value in defaults.items()}
    return create_model(f"{name}_settings", __base__=StrictModel, **fields)


def load_registry(path: str | Path, runners: Mapping[str, RunnerEntry | tuple]) -> DaemonRegistry:
    """Read daemons.yaml and build the registry; every problem is a ConfigError naming the file."""
    return build_registry(read_daemons(path), runners, str(path))


def read_daemons(path: str | Path) -> DaemonsFile:
    """Read and parse daemons.yaml; every problem is a ConfigError naming the file."""
    path = Path(path)
    return parse_daemons(read_yaml_mapping(path, "daemons"), str(path))
