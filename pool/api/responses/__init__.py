"""OpenAI's Responses API (POST /v1/responses, stored responses): routes.py."""
