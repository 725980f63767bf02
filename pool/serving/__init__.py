"""The serving door: how a request reaches a model on this host (pool/serving/door.py), and what
it asks of it: a completion, a token count, embeddings."""
