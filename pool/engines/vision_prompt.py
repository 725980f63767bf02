"""A vision model's prompt: chat messages whose content parts carry images (pool/serving/images.py's
`Image`: the file's bytes and their sha256) -> the token ids mlx-vlm's processor makes of them, with
the rendered text and the images kept beside the ids so the engine thread can read them again.

The ids count every image token, so the context fit, the prefill guard and the KV estimate see an
image-heavy prompt as the long prompt it is. The prompt cache keys an entry by the images' digests
(`cache_scope`), so a prompt with another image of the same size never reuses this one's KV."""

from __future__ import annotations

import io
from typing import Any, Sequence


class VisionPrompt(list):
    """Token ids (a list, as every engine's prompt is) and what made them: the rendered chat text
    and the images in the order their placeholders appear."""

    def __init__(self, ids: Sequence[int], *, text: str, images: tuple[Any, ...] = (), image_token: int | None = None):
        super().__init__(ids)
        self.text = text
        self.images = images
        self.image_tokens = sum(i == image_token for i in self) if image_token is not None else 0

    @property
    def digests(self) -> tuple[str, ...]:
        return tuple(image.digest for image in self.images)


def split_images(messages: list[dict]) -> tuple[list[dict], tuple[Any, ...]]:
    """(the messages as a chat template takes them: each image part a bare {"type": "image"}, the
    images in order). Messages without images come back as they were."""
    images: list[Any] = []
    out = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list) or not any(_is_image(part) for part in content):
            out.append(message)
            continue
        parts = []
        for part in content:
            if _is_image(part):
                images.append(part["image"])
                parts.append({"type": "image"})
            else:
                parts.append(part)
        out.append({**message, "content": parts})
    return out, tuple(images)


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image" and part.get("image") is not None


def cache_scope(scope: str | None, digests: tuple[str, ...]) -> str | None:
    """The prompt cache's scope of a prompt with these images: the key's scope and the images'
    content hashes, so an entry serves only prompts with the same images in the same order."""
    if not digests:
        return scope
    return f"{scope or ''}\x00images:{','.join(digests)}"


def pil_images(images: tuple[Any, ...]) -> list:
    """The images decoded again (on the thread that runs the processor); RGB as every processor wants."""
    from PIL import Image as PILImage

    out = []
    for image in images:
        with PILImage.open(io.BytesIO(image.data)) as opened:
            out.append(opened.convert("RGB"))
    return out
