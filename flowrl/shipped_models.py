"""The shapes models shipped in the package, by name (a leaf module: the command lines read it without torch)."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED_MODELS = {
    "shapes-base": ASSETS / "shapes_base",
    "shapes-base-v2": ASSETS / "shapes_base_v2",
    "shapes-meanflow": ASSETS / "shapes_meanflow",
    "shapes-video": ASSETS / "shapes_video",
    "shapes-video-v2": ASSETS / "shapes_video_v2",
    "shapes-video-i2v": ASSETS / "shapes_video_i2v",
}
#: the base the main job aligns, and what the app and ``flowrl sample`` / ``flowrl eval`` start from by default
DEFAULT_BASE = "shapes-base-v2"
