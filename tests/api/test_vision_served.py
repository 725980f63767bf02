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
    traced = server.wait_for(lambda: [t for t in server.get("/api/requests").json()["data"] if t["image_tokens"]])
    assert 0 < traced[0]["image_tokens"] < traced[0]["prompt_tokens"]          # the trace shows the image's tokens
    text = server.chat("vlm", messages=[{"role": "user", "content": "Hello"}], max_tokens=8).json()
    assert text["choices"][0]["finish_reason"] in ("length", "stop")
    green = [{"type": "image_url", "image_url": {"url": data_url((20, 200, 30))}},
             {"type": "text", "text": "What is this?"}]
    other = server.chat("vlm", messages=[{**image, "content": green}], max_tokens=8, temperature=0).json()
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0       # another image: nothing reused
    several = server.chat("vlm", messages=[image], max_tokens=8, n=2)
    assert several.status_code == 400 and several.json()["error"]["param"] == "n", several.text


def png_bytes(color) -> bytes:
    buffer = io.BytesIO()
    PILImage.new("RGB", (64, 48), color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_official_clients_send_a_png_to_a_vlm(start_server, make_model):
    """The openai, anthropic and ollama clients each send a generated PNG in their own shape; each
    answer reads the image (its prompt counts the image's tokens) and a repeat is served from the cache."""
    import ollama

    server = start_server({"vlm": make_model("vlm-gemma3_vision", None, arch="gemma3_vision")}, demo=False)
    png = png_bytes((30, 60, 220))
    text_only = server.openai().chat.completions.create(model="vlm", max_tokens=4, temperature=0,
                                                        messages=[{"role": "user", "content": "What is this?"}])
    seen = server.openai().chat.completions.create(model="vlm", max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url((30, 60, 220))}},
                                     {"type": "text", "text": "What is this?"}]}])
    assert seen.usage.prompt_tokens > text_only.usage.prompt_tokens + 16      # the image's own tokens
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png).decode()}}
    for _ in range(2):
        answer = server.anthropic().messages.create(model="vlm", max_tokens=4, messages=[
            {"role": "user", "content": [block, {"type": "text", "text": "What is this?"}]}])
    assert answer.usage.cache_read_input_tokens > 16 and answer.content[0].type == "text"
    with ollama.Client(host=server.url) as client:
        for _ in range(2):
            reply = client.chat(model="vlm", options={"num_predict": 4, "temperature": 0},
                                messages=[{"role": "user", "content": "What is this?", "images": [png]}])
    assert reply.prompt_eval_count > text_only.usage.prompt_tokens + 16
    raw = server.post("/api/chat", {"model": "vlm", "stream": False, "options": {"num_predict": 4, "temperature": 0},
                                    "messages": [{"role": "user", "content": "What is this?",
                                                  "images": [base64.b64encode(png).decode()]}]}).json()
    assert raw["prompt_eval_count"] == reply.prompt_eval_count
    assert raw["prompt_eval_cached_count"] >= raw["prompt_eval_count"] - 2     # the ollama client drops this field
