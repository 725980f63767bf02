"""What models exist and what they are: the folders found (discovery.py), the kinds of model
(kinds.py), the names clients use (names.py), and the converters that make folders (gguf.py,
fixture_models.py)."""
