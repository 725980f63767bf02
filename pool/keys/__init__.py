"""Named API keys (issue 23): rows in the database, stored hashed, each optionally limited to some
models and to a request rate; the routes check requests against an in-memory copy (registry.py)."""
