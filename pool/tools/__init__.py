"""Tool calling over plain data: which format a model writes calls in (formats.py), the request's
tools (request.py), the messages its chat template renders (prompt.py), the calls in its answer
(stream.py, with mlx-lm's parsers) and the call values the routes frame (calls.py). Import the
module you need: only stream.py and a model's own format load mlx-lm."""
