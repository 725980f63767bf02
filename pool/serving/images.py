"""The one place a request's images are read and checked, whatever dialect sent them.

A dialect's parser hands each image's source (a `data:` URL, plain base64, or an http(s) URL) to the
request's `ImageBudget`, with the field it came in (`messages[0].content[1].image_url.url`). The
budget counts the request's images and encoded bytes before anything is decoded; `decode_image`
reads the header, refuses a picture of more than OMLX_MAX_IMAGE_PIXELS before its pixels are
allocated, and decodes it whole, so a truncated or corrupt file is a 400 here and never an error in
the model. Every failure is an `InvalidImage` naming the field; the dialect words it at its edge.

http(s) URLs are fetched only when OMLX_IMAGE_FETCH is on (image_fetch.py); every other scheme is
refused. Decoding takes CPU time: the routes parse a body with images off the event loop."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from PIL import Image as PILImage
from PIL import UnidentifiedImageError

from ..errors import InvalidImage

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")          # what Pillow reads here; the first frame of a GIF
MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
TOO_MANY, TOO_LARGE, REFUSED, FETCH_FAILED = "too_many_images", "image_too_large", "image_url_refused", \
    "image_fetch_failed"


@dataclass(frozen=True)
class Image:
    """An image as the client sent it, checked: the model side decodes `data` again on its thread."""
    data: bytes      # the image file's bytes (PNG, JPEG, WebP, GIF)
    digest: str      # sha256 hex of data: the prompt cache's key for it
    width: int
    height: int
    format: str      # "PNG", "JPEG", "WEBP", "GIF"

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]

    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{base64.b64encode(self.data).decode()}"

    def __repr__(self) -> str:      # never 20 MB of bytes in a log line
        return f"Image({self.format} {self.width}x{self.height}, {len(self.data)} bytes, sha256 {self.digest[:12]})"


@dataclass(frozen=True)
class ImageLimits:
    max_images: int          # per request (0: images refused)
    max_bytes: int           # one image, encoded
    max_request_bytes: int   # every image of a request, encoded
    max_pixels: int          # width * height of one image
    fetch: bool = False      # http(s) URLs fetched (else refused)
    fetch_timeout: float = 10.0

    @classmethod
    def from_settings(cls, settings: Any) -> "ImageLimits":
        return cls(max_images=settings.max_images, max_bytes=settings.max_image_bytes,
                   max_request_bytes=settings.max_request_image_bytes, max_pixels=settings.max_image_pixels,
                   fetch=settings.image_fetch, fetch_timeout=settings.image_fetch_timeout)


def refuse(problem: str, param: str, code: str = InvalidImage.code) -> InvalidImage:
    return InvalidImage(f"{param}: {problem}", param=param, code=code)


def _mb(n: int) -> str:
    return f"{n / 1e6:g} MB"


def decode_image(data: bytes, *, param: str, limits: ImageLimits) -> Image:
    """The bytes of an image file -> an Image, or InvalidImage naming `param`."""
    if len(data) > limits.max_bytes:
        raise refuse(f"the image is {_mb(len(data))}; at most {_mb(limits.max_bytes)} (OMLX_MAX_IMAGE_BYTES)",
                     param, TOO_LARGE)
    # Pillow's own bomb check (at open) must not refuse what the setting allows, nor allow more
    PILImage.MAX_IMAGE_PIXELS = limits.max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            with PILImage.open(io.BytesIO(data), formats=FORMATS) as picture:
                width, height = picture.size
                _check_pixels(width, height, param, limits)
                picture.load()                 # the first frame only; a truncated file fails here
                kind = picture.format
    except InvalidImage:
        raise
    except (PILImage.DecompressionBombError, PILImage.DecompressionBombWarning):
        raise refuse(f"the image has more than {limits.max_pixels} pixels (OMLX_MAX_IMAGE_PIXELS)",
                     param, TOO_LARGE) from None
    except UnidentifiedImageError:
        raise refuse("not an image this server reads (PNG, JPEG, WebP or GIF)", param) from None
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, MemoryError) as e:
        raise refuse(f"the image is truncated or corrupt ({e})", param) from None
    if kind not in FORMATS or width < 1 or height < 1:
        raise refuse("not an image this server reads (PNG, JPEG, WebP or GIF)", param)
    return Image(data=data, digest=hashlib.sha256(data).hexdigest(), width=width, height=height, format=kind)


def _check_pixels(width: int, height: int, param: str, limits: ImageLimits) -> None:
    if width * height > limits.max_pixels:
        raise refuse(f"the image is {width}x{height} pixels; at most {limits.max_pixels} pixels "
                     "(OMLX_MAX_IMAGE_PIXELS)", param, TOO_LARGE)


def decoded_size(text: str) -> int:
    """The bytes `text` (base64) decodes to, within 2, without decoding it."""
    return len(text) * 3 // 4


def from_base64(text: str, param: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise refuse("not valid base64", param) from None


def split_data_url(url: str, param: str) -> tuple[str, str]:
    """`data:image/png;base64,<data>` -> ("image/png", "<data>")."""
    header, comma, payload = url.partition(",")
    if not comma or not header.lower().endswith(";base64"):
        raise refuse("a data URL must be base64: data:image/png;base64,...", param)
    media_type = header[len("data:"):-len(";base64")].strip().lower()
    if media_type and not media_type.startswith("image/"):
        raise refuse(f"a data URL of {media_type!r} is not an image", param)
    return media_type, payload


class ImageBudget:
    """One request's images, counted and read as its parser meets them. `fetch` (image_fetch.fetch)
    is called for http(s) URLs when the limits allow fetching."""

    def __init__(self, limits: ImageLimits, fetch: Callable[..., bytes] | None = None):
        self.limits, self._fetch = limits, fetch
        self.taken = 0        # images
        self.bytes = 0

    def count(self, size: int, param: str) -> None:
        """One image of `size` encoded bytes more, or InvalidImage when it breaks a limit."""
        limits = self.limits
        self.taken += 1
        if self.taken > limits.max_images:
            raise refuse(f"at most {limits.max_images} images per request (OMLX_MAX_IMAGES)" if limits.max_images
                         else "this server takes no images (OMLX_MAX_IMAGES is 0)", param, TOO_MANY)
        if size > limits.max_bytes:
            raise refuse(f"the image is {_mb(size)}; at most {_mb(limits.max_bytes)} (OMLX_MAX_IMAGE_BYTES)",
                         param, TOO_LARGE)
        self.bytes += size
        if self.bytes > limits.max_request_bytes:
            raise refuse(f"the request's images are more than {_mb(limits.max_request_bytes)} together "
                         "(OMLX_MAX_REQUEST_IMAGE_BYTES)", param, TOO_LARGE)

    def base64(self, text: Any, param: str, *, media_type: str | None = None) -> Image:
        """Plain base64 (Anthropic's `source.data`, Ollama's `images`). A `media_type` the client
        declared must be the image's own."""
        if not isinstance(text, str) or not text:
            raise refuse("must be a non-empty base64 string", param)
        self.count(decoded_size(text), param)
        image = decode_image(from_base64(text, param), param=param, limits=self.limits)
        if media_type and media_type.lower() != image.media_type:
            raise refuse(f"the image was declared {media_type} but is {image.media_type}", param)
        return image

    def url(self, url: Any, param: str) -> Image:
        """A `data:` URL, or an http(s) URL when fetching is on; any other scheme is refused."""
        if not isinstance(url, str) or not url:
            raise refuse("must be a URL (data:image/png;base64,...)", param)
        scheme = url.partition(":")[0].lower()
        if scheme == "data":
            _, payload = split_data_url(url, param)
            self.count(decoded_size(payload), param)
            return decode_image(from_base64(payload, param), param=param, limits=self.limits)
        if scheme in ("http", "https"):
            if not self.limits.fetch or self._fetch is None:
                raise refuse("this server does not fetch image URLs (OMLX_IMAGE_FETCH is off); send the image "
                             "inline as a data URL (data:image/png;base64,...)", param, REFUSED)
            self.count(0, param)
            room = min(self.limits.max_bytes, self.limits.max_request_bytes - self.bytes)
            data = self._fetch(url, param=param, max_bytes=room, timeout=self.limits.fetch_timeout)
            self.bytes += len(data)
            return decode_image(data, param=param, limits=self.limits)
        raise refuse("an image URL must be a data: URL" + (" or http(s)" if self.limits.fetch else "")
                     + f"; {scheme or 'this'!r} URLs are refused", param, REFUSED)


def image_parts(content: Any) -> list[Image]:
    """The images of a chat message's content (the normalised parts)."""
    if not isinstance(content, list):
        return []
    return [part["image"] for part in content if isinstance(part, dict) and part.get("type") == "image"]


def has_images(messages: list[dict] | None) -> bool:
    return any(image_parts(m.get("content")) for m in messages or ())


def parts(pieces: list[str | Image], joiner: str = "") -> str | list[dict]:
    """A message's text and images in order -> its content: a string when it holds no image (as
    before images), else text and image parts (adjacent texts joined as the text-only form joins them)."""
    if not any(isinstance(p, Image) for p in pieces):
        return joiner.join(p for p in pieces if isinstance(p, str))
    out: list[dict] = []
    texts: list[str] = []
    for piece in pieces:
        if piece == "":
            continue
        if isinstance(piece, Image):
            if texts:
                out.append({"type": "text", "text": joiner.join(texts)})
                texts = []
            out.append({"type": "image", "image": piece})
        else:
            texts.append(piece)
    if texts:
        out.append({"type": "text", "text": joiner.join(texts)})
    return out
