"""What the reward server accepts, how long it waits, and the memory that bounds.

Every field of :class:`Limits` is also a ``flowrl reward-server`` flag (``max_body_bytes`` ->
``--max-body-bytes``); its help text is the field's ``help`` metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

MiB = 2**20

#: bytes of Python objects per counted JSON value of a parsed request: at most 74 measured with tracemalloc
#: (a one-key dict per value; empty containers 32-36, strings 60, floats 32), doubled for the allocator
PARSED_BYTES_PER_JSON_VALUE = 128
#: bytes a pixel of the one image being decoded holds beside its float32 slot: its PNG bytes (3, more for
#: noise), Pillow's decoded and converted copies (4 each: Pillow keeps RGB in 4 bytes) and the 8-bit array
TRANSIENT_BYTES_PER_PIXEL = 4 + 4 + 4 + 3


def _limit(help_text: str) -> dict[str, str]:
    return {"help": help_text}


@dataclass(frozen=True)
class Limits:
    """What the server accepts; a request over a size limit is answered 413 before it is decoded.

    The defaults take the client's default batch (32 items) of images up to 720x720, 16 at 1024x1024, or
    one or two 480x832 videos of 33 to 81 frames. Memory is bounded by :func:`memory_bound` (about
    1.4 GiB with the defaults, plus the reward's own models), whatever the clients send.
    """

    max_body_bytes: int = field(default=64 * MiB, metadata=_limit("bytes of one request body; larger: 413"))
    max_items: int = field(default=64, metadata=_limit("images or videos in one request"))
    max_frames: int = field(default=128, metadata=_limit("frames in one video"))
    max_pixels: int = field(default=2048 * 2048, metadata=_limit("width x height of one image or frame"))
    max_total_pixels: int = field(
        default=32 * MiB, metadata=_limit("width x height summed over one request's images and frames")
    )
    max_json_values: int = field(
        default=50_000,
        metadata=_limit("commas, colons and opening brackets in one body (bounds its parsed objects)"),
    )
    max_in_flight: int = field(
        default=8, metadata=_limit("requests read and being parsed, decoded or scored; more: 503 (retry)")
    )
    max_decoded: int = field(
        default=2, metadata=_limit("requests holding decoded media at once (one scored, the next ready)")
    )
    max_buffered_bytes: int = field(
        default=256 * MiB,
        metadata=_limit("request bodies held at once, summed (being received or in flight); more: 503"),
    )
    max_connections: int = field(
        default=1024,
        metadata=_limit("open connections; at the cap a new one drops the oldest still sending headers"),
    )
    header_timeout_s: float = field(
        default=10.0, metadata=_limit("seconds a connection has to send a request's headers")
    )
    body_timeout_s: float = field(default=60.0, metadata=_limit("seconds a request has to send its body"))

    def __post_init__(self) -> None:
        for limit in fields(self):
            value = getattr(self, limit.name)
            if limit.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"Limits.{limit.name}={value!r}; allowed: an integer >= 1")
            if limit.type == "float" and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"Limits.{limit.name}={value!r}; allowed: a finite number of seconds > 0")
        if self.max_body_bytes > self.max_buffered_bytes:
            raise ValueError(
                f"Limits.max_body_bytes={self.max_body_bytes} is over max_buffered_bytes="
                f"{self.max_buffered_bytes}; allowed: max_body_bytes <= max_buffered_bytes"
            )


def memory_bound(limits: Limits) -> int:
    """Bytes the server's requests can hold at once, whatever is sent (the reward's own models aside):

        2 B  +  n_flight * v * c  +  n_decoded * (P_total * 12 + P_one * 15)

    ``B = max_buffered_bytes`` (every body counts against it from its first byte until its answer is
    sent; a body and its parsed strings both exist while it is parsed, hence 2), ``v = max_json_values``
    objects of ``c = PARSED_BYTES_PER_JSON_VALUE`` bytes per parsed request, ``n_decoded = max_decoded``
    requests holding float32 media of ``P_total = max_total_pixels`` pixels x 3 channels x 4 bytes, each
    decoding one image at a time with its PNG bytes and 8-bit array of ``P_one = max_pixels`` pixels.
    """
    bodies = 2 * limits.max_buffered_bytes
    parsed = limits.max_in_flight * limits.max_json_values * PARSED_BYTES_PER_JSON_VALUE
    decoded = limits.max_decoded * (
        limits.max_total_pixels * 3 * 4 + limits.max_pixels * TRANSIENT_BYTES_PER_PIXEL
    )
    return bodies + parsed + decoded
