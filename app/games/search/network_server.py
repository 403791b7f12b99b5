"""One network, several search processes: a network server that merges their batches.

A GPU evaluates a batch of 1,000 positions in about the time it takes one of 64, and one
search process on one core cannot gather that many leaves fast enough: the GPU waits for the
core. So on a GPU node several search workers (one a core) share one process that holds the
network (KataGo's search threads share its network server the same way): each worker sends
its round's leaves, the server takes every request that is waiting, evaluates them in ONE
forward pass, and answers each worker its share. While it evaluates, the other workers'
requests queue up, so its batches grow with the number of workers and no timer is needed.

    server = NetworkServer(model_path, sha256, game_name, device="cuda")   # starts the process
    client = SharedNetworkClient.connect(server.address, server.authkey, game_name, name="w0")
    priors, values = client.evaluate_batch(words)     # in any process; an Evaluator
    server.load(new_path, new_sha256)                 # a promotion: the same process, a new net
    server.stats()                                    # evaluations, batches, each client's share
    server.close()

Requests travel over a local socket (multiprocessing.connection, with a per-server random
key), as the game's batch form (uint64 words, 16 bytes a position), not as network input.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import threading
import time
from multiprocessing import Pipe
from multiprocessing.connection import Client, Connection, Listener, wait
from pathlib import Path

import numpy as np

from app.games import Game, get_game
from app.games.worker_processes import parent_gone, worker_context

_START_TIMEOUT_S = 120.0  # the server imports torch and loads the model before it answers
_CLOSE_TIMEOUT_S = 10.0


class NetworkServerError(RuntimeError):
    """The network server did not start, or answered with an error (its text)."""


class SharedNetworkClient:
    """An Evaluator whose answers come from a `NetworkServer`; one connection, one process."""

    def __init__(self, conn: Connection, game: Game) -> None:
        self.conn = conn
        self.game = game
        self.positions = 0
        self.batches = 0

    @classmethod
    def connect(cls, address: str, authkey: bytes, game_name: str, name: str = "") -> "SharedNetworkClient":
        conn = Client(address, authkey=authkey)
        conn.send(("hello", name or f"pid-{os.getpid()}"))
        return cls(conn, get_game(game_name))

    def evaluate_batch(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.positions += len(words)
        self.batches += 1
        self.conn.send(("eval", np.ascontiguousarray(words, dtype=np.uint64)))
        answer = self.conn.recv()
        if answer[0] != "ok":
            raise NetworkServerError(answer[1])
        return answer[1], answer[2]

    def evaluate(self, states) -> tuple[np.ndarray, np.ndarray]:
        return self.evaluate_batch(self.game.state_words(states))

    def close(self) -> None:
        self.conn.close()


class NetworkServer:
    """The owner's handle on a network server process (see the module docstring)."""

    def __init__(self, model_path: str | Path, sha256: str | None, game_name: str, device: str = "cpu") -> None:
        self.game_name = game_name
        self.authkey = secrets.token_bytes(32)
        self._dir = tempfile.TemporaryDirectory(prefix="netserver-")
        self.address = str(Path(self._dir.name) / "socket")
        ctx = worker_context()
        self._process = ctx.Process(target=serve, name="network-server", daemon=True,
                                    args=(self.address, self.authkey, str(model_path), sha256, game_name, device))
        self._process.start()
        self._control = self._connect_control()
        self.model = (str(model_path), sha256)

    def _connect_control(self) -> Connection:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if not self._process.is_alive():
                raise NetworkServerError(f"the network server exited with code {self._process.exitcode}")
            if os.path.exists(self.address):
                try:
                    conn = Client(self.address, authkey=self.authkey)
                    conn.send(("hello", "control"))
                    return conn
                except (ConnectionRefusedError, FileNotFoundError):
                    pass
            if time.monotonic() > deadline:
                self._process.kill()
                raise NetworkServerError(f"the network server did not listen within {_START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def _ask(self, *message) -> object:
        self._control.send(message)
        answer = self._control.recv()
        if answer[0] != "ok":
            raise NetworkServerError(answer[1])
        return answer[1]

    def load(self, model_path: str | Path, sha256: str | None) -> None:
        """Serve another model from now on (a promotion); the clients stay connected."""
        if (str(model_path), sha256) != self.model:
            self._ask("load", str(model_path), sha256)
            self.model = (str(model_path), sha256)

    def stats(self) -> dict:
        """{"evaluations", "batches", "seconds", "clients": {name: positions}} since the start."""
        return self._ask("stats")  # type: ignore[return-value]

    def alive(self) -> bool:
        return self._process.is_alive()

    def close(self) -> None:
        """Stop the process (killed if it does not stop within a few seconds). Idempotent."""
        if self._process.is_alive():
            try:
                self._control.send(("stop",))
            except OSError:
                pass
            self._process.join(_CLOSE_TIMEOUT_S)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(_CLOSE_TIMEOUT_S)
        self._control.close()
        self._dir.cleanup()


def serve(address: str, authkey: bytes, model_path: str, sha256: str | None, game_name: str, device: str) -> None:
    """The server process: one torch thread, the network on `device`, requests merged into one
    forward pass each time round; exits on "stop", or when its parent is gone."""
    import torch

    from app.games.search.model import load_model, predict

    torch.set_num_threads(1)
    game = get_game(game_name)

    def load(path: str, sha: str | None):
        net, _ = load_model(path, expect_game=game_name, expect_sha256=sha)
        return net.to(torch.device(device)).eval()

    net = load(model_path, sha256)
    listener = Listener(address, authkey=authkey)
    arrivals: list[Connection] = []
    lock = threading.Lock()
    wake_read, wake_write = Pipe(duplex=False)

    stopping = threading.Event()

    def accept() -> None:
        while not stopping.is_set():
            try:
                conn = listener.accept()
            except Exception:  # noqa: BLE001 - a wrong key or a reset handshake: refuse it, keep serving
                time.sleep(0.01)  # (once the listener is closed, `stopping` ends the loop)
                continue
            with lock:
                arrivals.append(conn)
            wake_write.send_bytes(b"!")

    threading.Thread(target=accept, name="accept", daemon=True).start()
    names: dict[Connection, str] = {}
    shares: dict[str, int] = {}
    evaluations = batches = 0
    started = time.monotonic()
    live: list = [wake_read]
    try:
        while not parent_gone():
            ready = wait(live, timeout=1.0)
            requests: list[tuple[Connection, np.ndarray]] = []
            for conn in ready:
                if conn is wake_read:
                    wake_read.recv_bytes()
                    with lock:
                        live.extend(arrivals)
                        arrivals.clear()
                    continue
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    live.remove(conn)
                    names.pop(conn, None)
                    continue
                kind = message[0]
                if kind == "eval":
                    requests.append((conn, message[1]))
                elif kind == "hello":
                    names[conn] = str(message[1])
                elif kind == "stats":
                    conn.send(("ok", {"evaluations": evaluations, "batches": batches,
                                      "seconds": round(time.monotonic() - started, 3), "clients": dict(shares)}))
                elif kind == "load":
                    try:
                        net = load(message[1], message[2])
                        conn.send(("ok", None))
                    except Exception as exc:  # noqa: BLE001 - the owner raises it
                        conn.send(("error", f"{type(exc).__name__}: {exc}"))
                elif kind == "stop":
                    return
            if not requests:
                continue
            words = np.concatenate([w for _, w in requests])
            priors, values = predict(net, game.words_planes(words), game.words_legal_masks(words))
            evaluations += len(words)
            batches += 1
            offset = 0
            for conn, w in requests:
                n = len(w)
                name = names.get(conn, "?")
                shares[name] = shares.get(name, 0) + n
                try:
                    conn.send(("ok", priors[offset:offset + n], values[offset:offset + n]))
                except OSError:  # the client went away mid-request
                    live.remove(conn)
                offset += n
    finally:
        stopping.set()
        listener.close()
