"""The operator CLI, `python -m app.cli` (see __main__.py)."""
