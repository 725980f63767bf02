"""Images in requests, without a server: pool/serving/images.py's decoding and limits (tables), the
image URL fetcher's address checks (an httpx MockTransport and a fake resolver: nothing leaves this
machine), and each dialect's parser turning its image shape into the same text and image parts."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import httpx
import pytest
from PIL import Image as PILImage

from pool.api.anthropic.parse import parse_messages
from pool.api.ollama.parse import parse_chat, parse_generate
from pool.api.openai.parse import parse_completion
from pool.api.responses.items import messages as response_messages
from pool.api.responses.parse import parse_responses
from pool.errors import InvalidImage, InvalidRequest
from pool.serving import image_fetch
from pool.serving.images import Image, ImageBudget, ImageLimits, decode_image, has_images

LIMITS = ImageLimits(max_images=3, max_bytes=100_000, max_request_bytes=150_000, max_pixels=1_000_000)


def picture(fmt: str, size=(16, 12)) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", size, (200, 30, 30)).save(out, fmt)
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_claiming(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims width x height pixels: a decompression bomb's shape."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + _chunk(b"IEND", b""))


PNG = picture("PNG")
B64 = base64.b64encode(PNG).decode()
DATA_URL = "data:image/png;base64," + B64
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>'


# ---- decode_image --------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, expected", [("PNG", "PNG"), ("JPEG", "JPEG"), ("WEBP", "WEBP"), ("GIF", "GIF")])
def test_the_formats_read(fmt, expected):
    data = picture(fmt)
    image = decode_image(data, param="p", limits=LIMITS)
    assert (image.format, image.width, image.height, image.data) == (expected, 16, 12, data)
    assert len(image.digest) == 64 and image.media_type == f"image/{expected.lower()}"


@pytest.mark.parametrize("name, data, code", [
    ("truncated", PNG[: len(PNG) // 2], "invalid_image"),
    ("not an image", b"hello, world", "invalid_image"),
    ("svg", SVG, "invalid_image"),
    ("bmp: Pillow reads it, this server does not", picture("BMP"), "invalid_image"),
    ("empty", b"", "invalid_image"),
    ("a 100000x100000 header (decompression bomb)", png_claiming(100_000, 100_000), "image_too_large"),
    ("over the pixel limit", png_claiming(2000, 1000), "image_too_large"),
    ("over the byte limit", PNG + b"\0" * 100_000, "image_too_large"),
])
def test_bad_images_are_400s_naming_the_field(name, data, code):
    with pytest.raises(InvalidImage) as refused:
        decode_image(data, param="messages[0].content[1].image_url.url", limits=LIMITS)
    assert refused.value.code == code
    assert refused.value.param == "messages[0].content[1].image_url.url"
    assert refused.value.message.startswith("messages[0].content[1].image_url.url: ")


def test_a_bomb_is_refused_from_its_header_in_a_few_bytes():
    bomb = png_claiming(100_000, 100_000)
    assert len(bomb) < 100
    with pytest.raises(InvalidImage, match="pixels"):
        decode_image(bomb, param="p", limits=ImageLimits(1, 10**6, 10**6, max_pixels=50_000_000))


# ---- a request's budget --------------------------------------------------------------------------

def _take(budget: ImageBudget, sources: list[str]) -> None:
    for k, source in enumerate(sources):
        budget.url(source, f"images[{k}]")


@pytest.mark.parametrize("name, limits, sources, param, code", [
    ("too many images", LIMITS, [DATA_URL] * 4, "images[3]", "too_many_images"),
    ("images refused", ImageLimits(0, 10**6, 10**6, 10**6), [DATA_URL], "images[0]", "too_many_images"),
    ("too many bytes together", ImageLimits(9, 10**6, 2 * len(PNG) + 9, 10**6), [DATA_URL] * 3, "images[2]",
     "image_too_large"),
    ("one too large before decoding", ImageLimits(9, len(PNG) // 2, 10**6, 10**6), [DATA_URL], "images[0]",
     "image_too_large"),
    ("http with fetching off", LIMITS, ["http://example.com/cat.png"], "images[0]", "image_url_refused"),
    ("https with fetching off", LIMITS, ["https://example.com/cat.png"], "images[0]", "image_url_refused"),
    ("file://", LIMITS, ["file:///etc/passwd"], "images[0]", "image_url_refused"),
    ("file:// with fetching on", ImageLimits(3, 10**6, 10**6, 10**6, fetch=True), ["file:///etc/passwd"], "images[0]",
     "image_url_refused"),
    ("ftp", LIMITS, ["ftp://example.com/a.png"], "images[0]", "image_url_refused"),
    ("a data URL that is not base64", LIMITS, ["data:image/png,abc"], "images[0]", "invalid_image"),
    ("a data URL of text", LIMITS, ["data:text/plain;base64,aGk="], "images[0]", "invalid_image"),
    ("bad base64", LIMITS, ["data:image/png;base64,@@@@"], "images[0]", "invalid_image"),
])
def test_budget_refusals(name, limits, sources, param, code):
    with pytest.raises(InvalidImage) as refused:
        _take(ImageBudget(limits, fetch=None), sources)
    assert refused.value.code == code
    if param is not None:
        assert refused.value.param == param


def test_the_byte_limit_is_checked_before_decoding(monkeypatch):
    monkeypatch.setattr("pool.serving.images.from_base64", lambda *a: pytest.fail("decoded"))
    with pytest.raises(InvalidImage, match="OMLX_MAX_IMAGE_BYTES"):
        ImageBudget(ImageLimits(9, len(PNG) // 2, 10**6, 10**6)).base64(B64, "images[0]")


def test_a_declared_media_type_must_be_the_images_own():
    with pytest.raises(InvalidImage, match="declared image/jpeg"):
        ImageBudget(LIMITS).base64(B64, "data", media_type="image/jpeg")


# ---- fetching (OMLX_IMAGE_FETCH on) -----------------------------------------------------------------

@pytest.mark.parametrize("address, public", [
    ("93.184.216.34", True), ("2606:2800:220:1:248:1893:25c8:1946", True),
    ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False), ("::1", False), ("fe80::1", False),
    ("fc00::1", False), ("::ffff:127.0.0.1", False), ("::ffff:169.254.169.254", False), ("224.0.0.1", False),
])
def test_public_addresses(address, public):
    assert image_fetch.public(address) is public


HOSTS = {"cdn.example": ["93.184.216.34"], "inside.example": ["10.0.0.7"],
         "mixed.example": ["93.184.216.35", "127.0.0.1"]}


def _fetch(url: str, handler, max_bytes: int = 10_000):
    def resolver(host: str, port: int) -> list[str]:
        if host[0].isdigit():
            return [host]
        if host not in HOSTS:
            raise OSError("no such host")
        return HOSTS[host]
    return image_fetch.fetch(url, param="images[0]", max_bytes=max_bytes, timeout=5, resolver=resolver,
                             transport=httpx.MockTransport(handler))


def _serve(routes: dict):
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.host in {a for addresses in HOSTS.values() for a in addresses}   # the pinned address
        return routes[(request.headers["host"], request.url.path)]()
    return handler


def test_a_public_image_is_fetched_from_the_checked_address():
    handler = _serve({("cdn.example", "/cat.png"): lambda: httpx.Response(200, content=PNG,
                                                                         headers={"content-type": "image/png"})})
    assert _fetch("https://cdn.example/cat.png", handler) == PNG


@pytest.mark.parametrize("url, routes, code", [
    ("http://inside.example/a.png", {}, "image_url_refused"),
    ("http://mixed.example/a.png", {}, "image_url_refused"),
    ("http://127.0.0.1/a.png", {}, "image_url_refused"),
    ("http://user:pw@cdn.example/a.png", {}, "image_url_refused"),
    ("http://nowhere.example/a.png", {}, "image_fetch_failed"),
    ("http://cdn.example/redirect", {("cdn.example", "/redirect"): lambda: httpx.Response(
        302, headers={"location": "http://inside.example/metadata"})}, "image_url_refused"),
    ("http://cdn.example/redirect", {("cdn.example", "/redirect"): lambda: httpx.Response(
        302, headers={"location": "http://169.254.169.254/latest"})}, "image_url_refused"),
    ("http://cdn.example/loop", {("cdn.example", "/loop"): lambda: httpx.Response(
        302, headers={"location": "/loop"})}, "image_fetch_failed"),
    ("http://cdn.example/big", {("cdn.example", "/big"): lambda: httpx.Response(
        200, content=b"\0" * 20_000, headers={"content-type": "image/png"})}, "image_too_large"),
    ("http://cdn.example/page", {("cdn.example", "/page"): lambda: httpx.Response(
        200, content=b"<html>", headers={"content-type": "text/html"})}, "image_fetch_failed"),
    ("http://cdn.example/gone", {("cdn.example", "/gone"): lambda: httpx.Response(404)}, "image_fetch_failed"),
])
def test_fetch_refusals(url, routes, code):
    with pytest.raises(InvalidImage) as refused:
        _fetch(url, _serve(routes))
    assert refused.value.code == code and refused.value.param == "images[0]"


def test_a_body_past_the_cap_is_dropped_while_read_without_a_content_length():
    def chunks():
        yield from (b"\0" * 4096 for _ in range(100))
    handler = _serve({("cdn.example", "/drip"): lambda: httpx.Response(
        200, content=chunks(), headers={"content-type": "image/png"})})
    with pytest.raises(InvalidImage, match="more than"):
        _fetch("http://cdn.example/drip", handler)


# ---- each dialect -> the same parts --------------------------------------------------------------

def _image_parts(content) -> list:
    return [(p["type"], p["image"].digest if p["type"] == "image" else p["text"]) for p in content]


EXPECTED = [("text", "What is this?"), ("image", Image.__name__)]


def test_openai_image_url_parts():
    spec = parse_completion({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": DATA_URL, "detail": "low"}}]}]}, chat=True).spec
    content = spec.messages[0]["content"]
    assert content[0] == {"type": "text", "text": "What is this?"}
    assert content[1]["type"] == "image" and content[1]["image"].data == PNG
    assert has_images(spec.messages)


def test_anthropic_image_blocks():
    spec = parse_messages({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}},
        {"type": "text", "text": "What is this?"}]}]}).spec
    assert [p["type"] for p in spec.messages[0]["content"]] == ["image", "text"]
    assert spec.messages[0]["content"][0]["image"].data == PNG


def test_ollama_images_on_chat_and_generate():
    spec = parse_chat({"model": "m", "messages": [{"role": "user", "content": "What?", "images": [B64]}]}).spec
    assert [p["type"] for p in spec.messages[0]["content"]] == ["image", "text"]
    generate = parse_generate({"model": "m", "prompt": "What?", "images": [B64]})
    assert not generate.empty and [p["type"] for p in generate.content] == ["image", "text"]


def test_text_only_messages_keep_their_string_content():
    assert parse_completion({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}, chat=True).spec.messages[0]["content"] == "ab"


def test_responses_input_image_is_read_and_kept_as_a_data_url():
    req = parse_responses({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What?"}, {"type": "input_image", "image_url": DATA_URL}]}]})
    assert req.input[0]["content"][1] == {"type": "input_image", "image_url": DATA_URL, "detail": "auto"}
    chat = req.spec(req.input).messages
    assert chat[0]["content"][1]["image"].data == PNG
    # a stored conversation replays from its items alone
    assert response_messages(req.input, {DATA_URL: chat[0]["content"][1]["image"]})[0]["content"][1]["type"] == "image"


@pytest.mark.parametrize("parse, param", [
    (lambda: parse_completion({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]}]},
        chat=True), "messages[0].content[1].image_url.url"),
    (lambda: parse_completion({"model": "m", "messages": [{"role": "assistant", "content": [
        {"type": "image_url", "image_url": {"url": DATA_URL}}]}]}, chat=True), "messages[0].content[0]"),
    (lambda: parse_completion({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": DATA_URL, "detail": "huge"}}]}]}, chat=True),
     "messages[0].content[0].image_url.detail"),
    (lambda: parse_messages({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}]}]}),
     "messages.0.content.0.source.data"),
    (lambda: parse_messages({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/svg+xml", "data": B64}}]}]}),
     "messages.0.content.0.source.media_type"),
    (lambda: parse_messages({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://example.com/a.png"}}]}]}),
     "messages.0.content.0.source.url"),
    (lambda: parse_chat({"model": "m", "messages": [{"role": "user", "content": "x", "images": [B64, "@@"]}]}),
     "messages[0].images[1]"),
    (lambda: parse_chat({"model": "m", "messages": [{"role": "assistant", "content": "x", "images": [B64]}]}),
     "messages[0].images"),
    (lambda: parse_generate({"model": "m", "prompt": "x", "raw": True, "images": [B64]}), "images"),
    (lambda: parse_responses({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "file_id": "file-1"}]}]}), "input[0].content[0].file_id"),
    (lambda: parse_responses({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "file:///etc/passwd"}]}]}), "input[0].content[0].image_url"),
    (lambda: parse_responses({"model": "m", "input": [{"role": "system", "content": [
        {"type": "input_image", "image_url": DATA_URL}]}]}), "input[0].content[0]"),
])
def test_each_dialect_names_the_images_field(parse, param):
    with pytest.raises(InvalidRequest) as refused:
        parse()
    assert refused.value.param == param
