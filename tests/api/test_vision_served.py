"""A fixture VLM through the server: an image chat over OpenAI's route, the same image again from the
prompt cache, a text-only chat, and the vision capability in /v1/models."""

import base64
import io

from PIL import Image as PILImage


def data_url(color) -> str:
    buffer = io.BytesIO()
    PILImage.new("RGB", (64, 48), color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_a_vlm_answers_images_and_text_through_the_server(start_server, make_model):
    server = start_server({"vlm": make_model("vlm-qwen2_vl", None, arch="qwen2_vl")}, demo=False)
    models = {m["id"]: m for m in server.get("/v1/models").json()["data"]}
    assert "vision" in models["vlm"]["capabilities"]
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url((200, 20, 30))}},
                                         {"type": "text", "text": "What is this?"}]}
    first = server.chat("vlm", messages=[image], max_tokens=8, temperature=0).json()
    again = server.chat("vlm", messages=[image], max_tokens=8, temperature=0).json()
    assert first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"] - 1
    text = server.chat("vlm", messages=[{"role": "user", "content": "Hello"}], max_tokens=8).json()
    assert text["choices"][0]["finish_reason"] in ("length", "stop")
    other = server.chat("vlm", messages=[{**image, "content": [
        {"type": "image_url", "image_url": {"url": data_url((20, 200, 30))}}, {"type": "text", "text": "What is this?"}]}],
        max_tokens=8, temperature=0).json()
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0       # another image: nothing reused
    several = server.chat("vlm", messages=[image], max_tokens=8, n=2)
    assert several.status_code == 400 and several.json()["error"]["param"] == "n", several.text
