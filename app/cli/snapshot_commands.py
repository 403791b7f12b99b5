"""`python -m app.cli snapshot save|restore|status`: a node's state in one archive.

    snapshot save FILE    [--config C] [--data-dir D] [--db-url URL]   while the node runs, on its machine
    snapshot restore FILE --data-dir NEW [--db-url URL]                onto a new, empty dir (and database)
    snapshot status FILE                                               verify every file, print the summary

Errors are one line on stderr naming the file; exit status 0 done, 1 refused, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.cli.snapshot import SnapshotError, read_verified, restore, save
from app.config import ConfigError, load_settings
from app.config.paths import NodePaths


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the manifest's summary as JSON")
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("save", help="snapshot a node's data dir (and database) into FILE")
    s.add_argument("file", type=Path)
    s.add_argument("--config", type=Path, help="the node's config YAML (its data dir, database, node id)")
    s.add_argument("--data-dir", type=Path, help="the node's data dir (default: the config's, else ./data)")
    s.add_argument("--db-url", help="the node's database URL (default: the config's; none: SQLite files)")
    r = sub.add_parser("restore", help="restore FILE into a new data dir")
    r.add_argument("file", type=Path)
    r.add_argument("--data-dir", type=Path, required=True, help="the new node's data dir (missing or empty)")
    r.add_argument("--db-url", help="load the stores into this empty database instead of SQLite files")
    st = sub.add_parser("status", help="verify FILE against its manifest and print what it holds")
    st.add_argument("file", type=Path)
    return p


def main(argv: list[str], prog: str = "python -m app.cli snapshot") -> int:
    as_json = "--json" in argv
    args = build_parser(prog).parse_args([a for a in argv if a != "--json"])
    try:
        if args.action == "save":
            settings = load_settings(args.config)
            paths = NodePaths(args.data_dir or settings.node.data_dir, args.db_url or settings.node.db_url)
            named = args.config is not None or "node_id" in settings.node.model_fields_set
            manifest = save(paths, args.file, node_id=settings.node.node_id if named else None)  # never a guess
            line = f"saved {args.file}: {_describe(manifest)} in {manifest['copy_s']:.1f} s"
        elif args.action == "restore":
            restored = restore(args.file, args.data_dir, args.db_url)
            manifest = restored.manifest
            line = f"restored {args.file} into {args.data_dir}" + (f" and {args.db_url.split('@')[-1]}" if args.db_url else "") + \
                f": {_describe(manifest)}"
            if restored.rewound:
                line += f"; generation {manifest['summary'].get('pipeline', {}).get('generation')} was {restored.rewound}" \
                        " and starts over (datasets and runs are not in a snapshot)"
        else:
            manifest = read_verified(args.file)
            line = f"{args.file}: verified, {_describe(manifest)}, of node {manifest.get('node_id') or '(unnamed: saved without --config)'} " \
                   f"({manifest['database']})"
    except (SnapshotError, ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"summary": manifest["summary"], "files": len(manifest["files"])}) if as_json else line)
    return 0


def _describe(manifest: dict) -> str:
    summary = manifest["summary"]
    size = sum(f["size"] for f in manifest["files"].values())
    games = summary.get("games", {}).get("count", 0)
    models = len(summary.get("models", []))
    best = summary.get("best_sha256")
    return f"{len(manifest['files'])} files, {size / 1e6:.1f} MB, {games} games, {models} models, " \
           f"best {best[:12] if best else 'none'}"
