"""Policy models. ``load_shapes_model`` resolves the shipped base model by name."""

from pathlib import Path

from flowrl.models.shapes_dit import ShapesDiT, ShapesDiTConfig

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SHIPPED_MODELS = {
    "shapes-base": ASSETS / "shapes_base",
    "shapes-meanflow": ASSETS / "shapes_meanflow",
    "shapes-video": ASSETS / "shapes_video",
}


def load_shapes_model(name_or_path: str) -> ShapesDiT:
    """A shapes model by shipped name (``shapes-base``) or by the path of a saved model directory."""
    path = SHIPPED_MODELS.get(name_or_path, Path(name_or_path))
    if not path.is_dir():
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither a shipped model {sorted(SHIPPED_MODELS)} nor a directory"
        )
    return ShapesDiT.from_pretrained(path)


__all__ = ["SHIPPED_MODELS", "ShapesDiT", "ShapesDiTConfig", "load_shapes_model"]
