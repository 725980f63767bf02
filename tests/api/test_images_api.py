"""Images through the HTTP API with the official openai, anthropic and ollama clients: a bad image is
each dialect's 400 envelope naming the image's field, and a good one reaches the serving door as
image parts, where the text-only demo model refuses it (400 `model_not_vision`)."""

from __future__ import annotations

import base64
import io

import anthropic
import ollama
import openai
import pytest
from PIL import Image as PILImage

from tests.conftest import DEMO


def _png() -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (16, 16), (0, 120, 255)).save(out, "PNG")
    return out.getvalue()


PNG = _png()
B64 = base64.b64encode(PNG).decode()
DATA_URL = "data:image/png;base64," + B64
NOT_AN_IMAGE = base64.b64encode(b"hello, I am text").decode()


@pytest.fixture(scope="module")
def server(module_server, demo_model_dir):
    return module_server({DEMO: demo_model_dir}, OMLX_MAX_IMAGES="2")


def _openai_chat(server, *urls: str):
    content = [{"type": "text", "text": "What is this?"}, *({"type": "image_url", "image_url": {"url": u}}
                                                            for u in urls)]
    return server.openai().chat.completions.create(model=DEMO, max_tokens=4,
                                                   messages=[{"role": "user", "content": content}])


@pytest.mark.parametrize("urls, code, param", [
    (["data:image/png;base64," + NOT_AN_IMAGE], "invalid_image", "messages[0].content[1].image_url.url"),
    (["http://169.254.169.254/latest/meta-data"], "image_url_refused", "messages[0].content[1].image_url.url"),
    (["file:///etc/passwd"], "image_url_refused", "messages[0].content[1].image_url.url"),
    ([DATA_URL] * 3, "too_many_images", "messages[0].content[3].image_url.url"),
    ([DATA_URL], "model_not_vision", "messages"),
])
def test_openai_chat(server, urls, code, param):
    with pytest.raises(openai.BadRequestError) as refused:
        _openai_chat(server, *urls)
    assert refused.value.status_code == 400
    assert (refused.value.code, refused.value.param) == (code, param)
    assert refused.value.body["type"] == "invalid_request_error"


def test_openai_responses(server):
    client = server.openai()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=DEMO, input=[{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-abc", "detail": "auto"}]}])
    assert refused.value.status_code == 400 and refused.value.param == "input[0].content[0].file_id"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=DEMO, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": DATA_URL, "detail": "auto"}]}])
    assert refused.value.code == "model_not_vision"


@pytest.mark.parametrize("source, code_in_message", [
    ({"type": "base64", "media_type": "image/png", "data": NOT_AN_IMAGE}, "messages.0.content.0.source.data"),
    ({"type": "base64", "media_type": "image/jpeg", "data": B64}, "declared image/jpeg"),
    ({"type": "url", "url": "http://127.0.0.1:1/a.png"}, "OMLX_IMAGE_FETCH is off"),
    ({"type": "base64", "media_type": "image/png", "data": B64}, "cannot see images"),
])
def test_anthropic_messages(server, source, code_in_message):
    with pytest.raises(anthropic.BadRequestError) as refused:
        server.anthropic().messages.create(model=DEMO, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": source}, {"type": "text", "text": "What is this?"}]}])
    assert refused.value.status_code == 400
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "invalid_request_error"
    assert code_in_message in refused.value.body["error"]["message"]


@pytest.fixture(scope="module")
def ollama_client(server):
    with ollama.Client(host=server.url, timeout=120) as client:
        yield client


@pytest.mark.parametrize("images, words", [
    ([b"hello, I am text"], "messages[0].images[0]"),
    ([PNG, PNG, PNG], "OMLX_MAX_IMAGES"),
    ([PNG], "cannot see images"),
])
def test_ollama_chat(ollama_client, images, words):
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client.chat(model=DEMO, messages=[{"role": "user", "content": "What is this?", "images": images}])
    assert refused.value.status_code == 400 and words in refused.value.error


@pytest.mark.parametrize("images, words", [
    ([b"hello, I am text"], "images[0]"),
    ([PNG], "cannot see images"),
])
def test_ollama_generate(ollama_client, images, words):
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client.generate(model=DEMO, prompt="What is this?", images=images)
    assert refused.value.status_code == 400 and words in refused.value.error


def test_text_still_works(server):
    answer = server.openai().chat.completions.create(
        model=DEMO, max_tokens=2, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
    assert answer.choices[0].finish_reason in ("length", "stop")
