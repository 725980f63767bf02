"""Ollama's native API (/api/version, /api/tags, /api/ps, /api/show, and `GET /`'s liveness answer):
Ollama's field names, NDJSON streams, and its error shape {"error": "..."} (words.py). The model
facts Ollama's clients read (digest, details, model_info, template) come from each model's folder
(cards.py); the routes are in info.py."""
