#!/usr/bin/env python3
"""Train a candidate model on an exported dataset (thin CLI over the launcher and trainer).

    python scripts/train.py --dataset data/datasets/d1 --run-dir runs/r1 [--parent best.safetensors]
        [--config node.yaml] [--nproc 2] [--resume auto] [--nnodes 2 --node-rank 0 --rdzv-endpoint h:29400]
        [-- EXTRA TRAINER ARGS, e.g. --epochs 2 --max-steps 500]

Runs `app.games.train.train` under torchrun via `app.shared.launcher` (per-rank logs in
<run-dir>/logs). On success prints ONE JSON object, <run-dir>/result.json (candidate path and
sha256, steps, holdout loss), and exits 0; a failed rank -> exit 1 with the rank, its exit code
and its last log lines on stderr.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config import ConfigError, load_settings  # noqa: E402
from app.shared.launcher import LaunchError, LaunchSpec, launch, parse_nproc, resolve_nproc  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, type=Path)
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--parent", type=Path)
    p.add_argument("--config", type=Path)
    p.add_argument("--resume", help="checkpoint path or 'auto'")
    p.add_argument("--nproc", type=parse_nproc,
                   help="processes on this node: N or auto (default: train.nproc; 0 = one per GPU, 1 without)")
    p.add_argument("--nnodes", default="1")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--rdzv-endpoint")
    p.add_argument("--master-port", type=int)
    p.add_argument("--timeout-s", type=float)
    p.add_argument("--quiet", action="store_true", help="do not echo rank output")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="-- then extra app.games.train.train arguments")
    args = p.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"train failed: {exc}", file=sys.stderr)
        return 2
    target = ["-m", "app.games.train.train", "--dataset", str(args.dataset), "--run-dir", str(args.run_dir)]
    if args.config:
        target += ["--config", str(args.config)]
    if args.parent:
        target += ["--parent", str(args.parent)]
    if args.resume:
        target += ["--resume", args.resume]
    target += args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    spec = LaunchSpec(target=target, nproc=resolve_nproc(args.nproc if args.nproc is not None else settings.train.nproc), log_dir=args.run_dir / "logs",
                      nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                      master_port=args.master_port, timeout_s=args.timeout_s, echo=not args.quiet)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through the launcher's teardown
    try:
        launch(spec, out=sys.stderr)
    except LaunchError as exc:
        print(f"train failed: {exc}", file=sys.stderr)
        return 2 if exc.exit_code == 2 else 1
    result_path = args.run_dir / "result.json"
    if args.node_rank == 0 and result_path.exists():
        print(json.dumps(json.loads(result_path.read_text()), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
