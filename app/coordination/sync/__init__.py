"""The mesh data plane: games flow to the trainer, promoted models flow to every node.

Both travel over the mesh's signed HTTP API (MeshNode.add_routes, MeshClient), with bounded
requests, and both are safe to interrupt at any point:

    wire.py          bounds and body schemas shared by both ends
    game_server.py   GET /games/manifest, POST /games/fetch   (GameSyncServer, game_routes)
    game_sync.py     pull_games, sync_from_peers, PeerCursor, SyncReport, SyncError
    model_server.py  GET /models/<sha256>, GET /models/<sha256>/meta   (model_routes)
    model_store.py   the <sha256>.safetensors store: model_file, install_model, is_installed, installed_models
    model_fetch.py   fetch_model, fetch_from_mesh, peers_with_model, ModelFetchError
    ranges.py        id ranges, range digests, placement by rendezvous hash (pure)
    replica_store.py ReplicatedStore (the interface anti-entropy needs), GameStore (the replay DB)
    replica_server.py /replica/<store>/digest, /ids, /fetch   (replica_routes; games: GameSyncServer)
    replication.py   Replicator: one anti-entropy round (pull what is lacking, count own copies)

Embedding (orchestrator):

    games = GameSyncServer(db_path)
    node.add_routes(games.routes() + model_routes(models_dir))      # before node.start()
    node.update_local_state(inventory={"models": installed_models(models_dir), ...})
    await sync_from_peers(node, db_path, data_dir / "sync", budget_s=30)   # trainer, periodically
    path = await fetch_from_mesh(node, sha256, models_dir)                 # on MODEL_PROMOTED
"""

from app.coordination.sync.game_server import GameSyncServer, game_routes
from app.coordination.sync.game_sync import PeerCursor, SyncError, SyncReport, pull_games, sync_from_peers
from app.coordination.sync.model_fetch import ModelFetchError, fetch_from_mesh, fetch_model, peers_with_model
from app.coordination.sync.model_store import install_model, installed_models, is_installed, model_file
from app.coordination.sync.model_server import model_routes

__all__ = [
    "GameSyncServer", "ModelFetchError", "PeerCursor", "SyncError", "SyncReport", "fetch_from_mesh",
    "fetch_model", "game_routes", "install_model", "installed_models", "is_installed", "model_file", "model_routes",
    "peers_with_model",
    "pull_games", "sync_from_peers",
]
