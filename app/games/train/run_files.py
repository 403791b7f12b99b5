"""The files a game training run writes into its run dir (train.py, rank 0), named once for
the trainer and for the node that reads them, which need not load torch to do so."""

CHECKPOINT_NAME = "checkpoint.pt"
METRICS_NAME = "metrics.jsonl"
RESULT_NAME = "result.json"
CANDIDATE_NAME = "candidate.safetensors"
