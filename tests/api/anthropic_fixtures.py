"""Shared by the Anthropic Messages API tests (test_anthropic_*.py): a question and a tool, with the
OpenAI-style function tool it becomes."""

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
WEATHER_FN = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": WEATHER["input_schema"]}}
