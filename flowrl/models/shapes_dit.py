"""ShapesDiT: the tiny text-conditioned flow model of the shapes world.

A diffusion transformer over 32x32 RGB pixels whose ``forward`` returns the
flow-matching velocity ``v = eps - x0`` of ``x_t = (1 - t) x0 + t eps``.

Output parametrisation (``ShapesDiTConfig.prediction``):
  - ``"velocity"``: the network head is ``v`` itself;
  - ``"sample"``: the head is the clean image ``x0_hat`` and the velocity is
    ``v = (x_t - x0_hat) / max(t, t_min)`` (x-prediction, Li & He 2025, "Back
    to Basics: Let Denoising Generative Models Denoise"). Clean pixels lie on
    a simple manifold (mostly black), so a small pixel-space model predicts
    them far better than the noisy velocity.

Conditioning, designed so that binding, counts and positions are learnable:
  - the prompt goes through a small transformer text encoder (word
    embeddings + learned positions), so each word token knows its neighbours
    ("red" binds to the next shape word, "left of" to its objects);
  - every block cross-attends from image patches to these word tokens, so a
    patch can ask "which object belongs here";
  - the pooled text vector plus the time embedding drive adaLN-zero
    modulation of every block (global facts such as the count);
  - image patches carry learned 2-D position embeddings, so "left" and
    "above" have a place to bind to.

MeanFlow variant (``ShapesDiTConfig.mean_flow``): ``forward(x_t, t, ids,
mask, r)`` returns the **average** velocity ``u(x_t, r, t)`` over ``[r, t]``
(``x_r = x_t - (t - r) u``); the interval ``t - r`` gets its own embedding,
added to the time embedding. Its last layer starts at zero, so a MeanFlow
model made from a flow model (:meth:`ShapesDiT.as_mean_flow`) starts as
``u(x, r, t) = v(x, t)``. With ``"sample"`` prediction the head is the
endpoint estimate ``x_t - t u``.

Video variant (``ShapesDiTConfig.num_frames > 1``): ``x`` is a clip
``[B, T, 3, H, W]``; a token is a tubelet of ``frame_patch`` frames of one
``patch_size``-square patch, position = learned 2-D patch embedding + learned
frame-group embedding, and attention runs over all tokens of the clip (space
and time jointly; ``video_attention: joint``) or, ``factorized``, within each
frame followed by attention across the frames of each patch position (a
:class:`TemporalAttention` layer per block that starts as the identity).
:meth:`ShapesDiT.as_video` makes one from an image model. With ``frame_condition``
a learned vector per frame (zero to start) joins the time and text in the adaLN
condition, ``c_k = silu(emb(t) + W pooled + f_k)``: a frame's index then reaches
every block at full strength, where the frame embedding added to the patches is
swamped by the noise at high ``t`` (norm 0.5 against 6.4 for a noise patch in
``shapes-video``), the levels at which a clip's motion is decided.

Image-to-video (``image_condition``): the clip is conditioned on its first frame as Wan 2.1's I2V models
are, by channels concatenated to the noisy input: a conditioning clip ``y`` (the given frame in frame 0,
zeros elsewhere) and a mask channel ``m`` (1 on frame 0), patchified like ``x`` and embedded by their own
linear layer, ``tokens = W_x patch(x_t) + W_y patch([y, m]) + positions``, with ``W_y`` zero to start, so a
video model made image-conditioned (:meth:`ShapesDiT.with_image_condition`) starts as the video model.

Longer than 400 lines on purpose: one model, one file (diffusers' rule), read in the order the data
flows; its image, video and MeanFlow variants share every layer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from flowrl.models.attention import TemporalAttention, attention, cpu_autocast_enabled
from flowrl.shapes.tokenizer import ShapesTokenizer

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass
class ShapesDiTConfig:
    """Architecture of a :class:`ShapesDiT`; saved beside its weights as ``config.json``."""

    vocabulary: list[str] = field(default_factory=list)
    image_size: int = 32
    channels: int = 3
    patch_size: int = 4
    hidden_size: int = 128
    depth: int = 6
    num_heads: int = 4
    mlp_ratio: float = 4.0
    text_hidden_size: int = 128
    text_layers: int = 2
    text_heads: int = 4
    max_prompt_tokens: int = 16
    prediction: str = "velocity"  #: "velocity" or "sample" (see module docstring)
    min_time: float = 0.05  #: t_min of the "sample" parametrisation
    mean_flow: bool = False  #: predict the average velocity u(x, r, t) (a MeanFlow model)
    num_frames: int = 1  #: frames per sample: 1 = an image model, more = a video model over clips
    frame_patch: int = 1  #: frames per token (tubelet depth) of a video model
    video_attention: str = "joint"  #: video: "joint" (space-time) or "factorized" (frame, then time)
    #: video: a learned per-frame vector (zero to start) added to the time-and-text condition, so every
    #: block's adaLN modulation knows which frame it is in, however noisy the frame (see module docstring)
    frame_condition: bool = False
    #: width (odd) of the text encoder's neighbour-word convolution, 0 for none (see :class:`TextEncoder`)
    text_neighbour_window: int = 0
    #: video: conditioned on a given first frame (image-to-video; see module docstring)
    image_condition: bool = False


PREDICTIONS = ("velocity", "sample")
NEIGHBOUR_WINDOWS = (0, *range(1, 16, 2))
VIDEO_ATTENTIONS = ("joint", "factorized")

#: the largest ``config.json`` a model directory may hold, and the most parameters its architecture may have:
#: a 1 KB file must not make the loader allocate gigabytes before the weights are read (the shipped models have
#: 2.6M parameters; the bound leaves room for shapes models 100x larger)
MAX_CONFIG_BYTES = 1_000_000
MAX_PARAMETERS = 500_000_000
#: upper bounds of the integer fields, checked before the architecture is even counted
FIELD_LIMITS = {
    "image_size": 1024,
    "channels": 16,
    "patch_size": 64,
    "hidden_size": 8192,
    "depth": 128,
    "num_heads": 128,
    "text_hidden_size": 8192,
    "text_layers": 128,
    "text_heads": 128,
    "max_prompt_tokens": 4096,
    "num_frames": 512,
    "frame_patch": 64,
}


def read_model_config(path: Path) -> ShapesDiTConfig:
    """A ``config.json`` checked before anything is built: at most :data:`MAX_CONFIG_BYTES`, only the fields of
    :class:`ShapesDiTConfig`, integers within :data:`FIELD_LIMITS`, and an architecture of at most
    :data:`MAX_PARAMETERS` parameters (counted on the meta device, which allocates nothing); a one-line
    ``ValueError`` naming the file otherwise."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(
            f"{path} is {path.stat().st_size:,} bytes; a model config.json is at most {MAX_CONFIG_BYTES:,}"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a JSON model config ({error})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds {type(raw).__name__}; expected an object of ShapesDiTConfig fields")
    allowed = {item.name for item in fields(ShapesDiTConfig)}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"{path} has unknown fields {unknown[:5]}; allowed: {sorted(allowed)}")
    for name, limit in FIELD_LIMITS.items():
        value = raw.get(name, 1)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise ValueError(f"{path}: {name}={value!r} is not allowed; expected an integer in [1, {limit}]")
    ratio = raw.get("mlp_ratio", 4.0)
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio <= 64:
        raise ValueError(f"{path}: mlp_ratio={ratio!r} is not allowed; expected a number in (0, 64]")
    vocabulary = raw.get("vocabulary", [])
    if not isinstance(vocabulary, list) or not all(isinstance(word, str) for word in vocabulary):
        raise ValueError(f"{path}: vocabulary is not allowed; expected a list of words")
    config = ShapesDiTConfig(**raw)
    with torch.device("meta"):
        count = sum(parameter.numel() for parameter in ShapesDiT(config).parameters())
    if count > MAX_PARAMETERS:
        raise ValueError(
            f"{path} describes a model of {count:,} parameters; flowrl loads shapes models of at most "
            f"{MAX_PARAMETERS:,}"
        )
    return config


class PrecisionAwareGELU(nn.Module):
    """The MLP's activation: GELU with the tanh approximation the model was trained with,
    ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x³)))``, and on a bfloat16 input (the bf16 path, where it
    follows a bfloat16 matrix product) the exact GELU ``x Phi(x)`` it approximates. The two differ by less
    than 5e-4 anywhere, below the resolution bfloat16 gave the input (8 bits: 4e-3 at 1); torch 2.14.1's
    CPU kernel of the tanh form takes 2.0 ms on 4096 x 512 bfloat16 values against 0.47 ms for the
    exact one (2 threads), 14% of the bf16 main-job step. Every role of a run meets the same dtype, so they
    all run the same function."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x) if x.dtype == torch.bfloat16 else F.gelu(x, approximate="tanh")


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


def _per_token(values: torch.Tensor, length: int) -> torch.Tensor:
    """A modulation ``[B, D]`` (one per sample) or ``[B, T, D]`` (one per frame) as ``[B, 1 or L, D]``,
    broadcastable over ``length`` frame-major tokens."""
    if values.ndim == 2:
        return values[:, None]
    return values.repeat_interleave(length // values.shape[1], dim=1)


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding of ``1000 t`` (diffusers' timestep scale), ``[B, dim]``."""
    half = dim // 2
    frequencies = torch.exp(
        -math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half
    )
    angles = 1000.0 * t.float()[:, None] * frequencies[None]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class TextEncoder(nn.Module):
    """Word embeddings + learned positions + a pre-norm transformer encoder.

    Returns per-token features ``[B, L, D]`` and a pooled vector ``[B, D]``
    (the mean over real tokens).

    With ``text_neighbour_window = k > 0`` each word's embedding first gets a convolution over its
    ``k`` neighbours (zero-padded, padding tokens masked)::

        e_i <- e_i + sum_{j=-(k-1)/2}^{(k-1)/2} W_j e_{i+j} + b,       W, b = 0 at init

    Without it word order reaches the transformer only through the learned positions, which
    pretraining leaves 25x smaller than the word embeddings (RMS 0.039 against 1.01 in shapes-base):
    the encoder then reads "a red circle and a blue square" almost as it reads "a blue circle and a
    red square" (the velocity changes by 1-2% of a change of words; ``scripts/binding_check.py``). The
    convolution ties each colour to the word after it and each shape to its relation, and at zero it
    is the identity, so :meth:`ShapesDiT.with_neighbour_window` adds it to a trained model.
    """

    def __init__(self, vocab_size: int, config: ShapesDiTConfig) -> None:
        super().__init__()
        width = config.text_hidden_size
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Parameter(torch.zeros(1, config.max_prompt_tokens, width))
        layer = nn.TransformerEncoderLayer(
            width, config.text_heads, 2 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, config.text_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        nn.init.normal_(self.position_embedding, std=0.02)
        window = config.text_neighbour_window
        self.neighbour_mixing = nn.Conv1d(width, width, window, padding=window // 2) if window else None
        if self.neighbour_mixing is not None:
            nn.init.zeros_(self.neighbour_mixing.weight)
            nn.init.zeros_(self.neighbour_mixing.bias)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """In float32 under CPU autocast (a few tokens; see :func:`attention` for why)."""
        words = self.token_embedding(ids)
        float32 = torch.autocast("cpu", enabled=False) if cpu_autocast_enabled(words) else nullcontext()
        with float32:
            if self.neighbour_mixing is not None:
                masked = (words * mask[..., None]).transpose(1, 2)
                words = words + self.neighbour_mixing(masked).transpose(1, 2)
            tokens = words + self.position_embedding[:, : ids.shape[1]]
            tokens = self.norm(self.encoder(tokens, src_key_padding_mask=~mask))
        weights = mask.float()[..., None]
        pooled = (tokens * weights).sum(1) / weights.sum(1)
        return tokens, pooled


@dataclass
class TextContext:
    """A prompt batch through the text encoder: per-token features, the pooled vector and the mask, and
    each block's cross-attention keys and values, which the block adds on its first call (inside its own
    forward, where a sharded block has its weights). None of it depends on ``x`` or ``t``, so one context
    serves every step of a rollout."""

    tokens: torch.Tensor
    pooled: torch.Tensor
    mask: torch.Tensor
    keys_values: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class DiTBlock(nn.Module):
    """adaLN-zero block: self-attention, cross-attention to text tokens, MLP.

    With ``temporal`` (a factorized video model) self-attention runs within
    each frame and a :class:`TemporalAttention` layer follows it.
    """

    def __init__(
        self, hidden: int, heads: int, mlp_ratio: float, text_hidden: int, temporal: bool = False
    ) -> None:
        super().__init__()
        self.heads = heads
        self.norm_self = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.self_out = nn.Linear(hidden, hidden)
        self.norm_cross = nn.LayerNorm(hidden, eps=1e-6)
        self.cross_q = nn.Linear(hidden, hidden)
        self.cross_kv = nn.Linear(text_hidden, 2 * hidden)
        self.cross_out = nn.Linear(hidden, hidden)
        self.norm_mlp = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        inner = int(hidden * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(hidden, inner), PrecisionAwareGELU(), nn.Linear(inner, hidden))
        self.modulation = nn.Linear(hidden, 6 * hidden)
        nn.init.zeros_(self.modulation.weight)
        nn.init.zeros_(self.modulation.bias)
        nn.init.zeros_(self.cross_out.weight)
        nn.init.zeros_(self.cross_out.bias)
        self.temporal: TemporalAttention | None = TemporalAttention(hidden, heads) if temporal else None

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        return x.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        batch, heads, length, width = x.shape
        return x.transpose(1, 2).reshape(batch, length, heads * width)

    def forward(
        self,
        x: torch.Tensor,
        condition: torch.Tensor,
        text: TextContext,
        frames: int = 1,
    ) -> torch.Tensor:
        shift_attn, scale_attn, gate_attn, shift_mlp, scale_mlp, gate_mlp = (
            _per_token(part, x.shape[1]) for part in self.modulation(condition).chunk(6, -1)
        )
        q, k, v = self.qkv(_modulate(self.norm_self(x), shift_attn, scale_attn)).chunk(3, -1)
        if self.temporal is not None:  # within each frame: [B, T N, D] -> [B T, N, D]
            batch, length, width = x.shape
            q, k, v = (part.reshape(batch * frames, length // frames, width) for part in (q, k, v))
        attended = self._merge(attention(self._heads(q), self._heads(k), self._heads(v)))
        x = x + gate_attn * self.self_out(attended.reshape(x.shape))
        if self.temporal is not None:
            x = self.temporal(x, frames)
        key, value = text.keys_values.get(self) or text.keys_values.setdefault(
            self, tuple(self.cross_kv(text.tokens).chunk(2, -1))
        )
        attended = attention(
            self._heads(self.cross_q(self.norm_cross(x))),
            self._heads(key),
            self._heads(value),
            attn_mask=text.mask[:, None, None, :],
        )
        x = x + self.cross_out(self._merge(attended))
        return x + gate_mlp * self.mlp(_modulate(self.norm_mlp(x), shift_mlp, scale_mlp))


class ShapesDiT(nn.Module):
    """Text-conditioned DiT velocity model: ``forward(x_t, t, ids, mask) -> v``, x in ``[B, 3, H, W]``."""

    def __init__(self, config: ShapesDiTConfig) -> None:
        super().__init__()
        if not config.vocabulary:
            raise ValueError(
                "ShapesDiTConfig.vocabulary is empty; build it from flowrl.shapes.grammar.vocabulary()"
            )
        if config.image_size % config.patch_size:
            raise ValueError(
                f"image_size {config.image_size} is not a multiple of patch_size {config.patch_size}"
            )
        if config.prediction not in PREDICTIONS:
            raise ValueError(f"unknown prediction {config.prediction!r}; allowed: {PREDICTIONS}")
        if config.video_attention not in VIDEO_ATTENTIONS:
            raise ValueError(
                f"unknown video_attention {config.video_attention!r}; allowed: {VIDEO_ATTENTIONS}"
            )
        if not isinstance(config.frame_condition, bool) or (
            config.frame_condition and config.num_frames == 1
        ):
            raise ValueError(
                f"frame_condition={config.frame_condition!r} is not allowed for num_frames={config.num_frames}; "
                "expected true or false (true only for a video model)"
            )
        if not isinstance(config.image_condition, bool) or (
            config.image_condition and config.num_frames == 1
        ):
            raise ValueError(
                f"image_condition={config.image_condition!r} is not allowed for num_frames={config.num_frames}; "
                "expected true or false (true only for a video model)"
            )
        window = config.text_neighbour_window
        if isinstance(window, bool) or window not in NEIGHBOUR_WINDOWS:
            raise ValueError(
                f"text_neighbour_window={window!r} is not allowed; expected 0 (none) or an odd integer in [1, 15]"
            )
        if config.num_frames < 1 or config.frame_patch < 1 or config.num_frames % config.frame_patch:
            raise ValueError(
                f"num_frames={config.num_frames} must be a positive multiple of frame_patch={config.frame_patch}"
            )
        self.config = config
        self.tokenizer = ShapesTokenizer(config.vocabulary, config.max_prompt_tokens)
        hidden, patch = config.hidden_size, config.patch_size
        grid = config.image_size // patch
        self.text_encoder = TextEncoder(self.tokenizer.size, config)
        self.patch_embed = nn.Linear(config.frame_patch * config.channels * patch * patch, hidden)
        self.image_embed = (
            nn.Linear(config.frame_patch * (config.channels + 1) * patch * patch, hidden)
            if config.image_condition
            else None
        )
        self.position_embedding = nn.Parameter(torch.zeros(1, grid * grid, hidden))
        self.frame_embedding = (
            nn.Parameter(torch.zeros(1, config.num_frames // config.frame_patch, 1, hidden))
            if self.is_video
            else None
        )
        self.frame_condition = (
            nn.Parameter(torch.zeros(1, config.num_frames // config.frame_patch, hidden))
            if self.is_video and config.frame_condition
            else None
        )
        self.time_mlp = nn.Sequential(nn.Linear(256, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.interval_mlp = (
            nn.Sequential(nn.Linear(256, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
            if config.mean_flow
            else None
        )
        self.text_to_condition = nn.Linear(config.text_hidden_size, hidden)
        self.blocks = nn.ModuleList(
            DiTBlock(hidden, config.num_heads, config.mlp_ratio, config.text_hidden_size, self.is_factorized)
            for _ in range(config.depth)
        )
        self.final_norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.final_modulation = nn.Linear(hidden, 2 * hidden)
        self.final_linear = nn.Linear(hidden, config.frame_patch * config.channels * patch * patch)
        nn.init.normal_(self.position_embedding, std=0.02)
        if self.frame_embedding is not None:
            nn.init.normal_(self.frame_embedding, std=0.02)
        zero_initialised = [self.final_modulation, self.final_linear]
        if self.image_embed is not None:
            zero_initialised.append(self.image_embed)
        if self.interval_mlp is not None:
            zero_initialised.append(self.interval_mlp[-1])
        for module in zero_initialised:
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)

    @property
    def is_video(self) -> bool:
        return self.config.num_frames > 1

    @property
    def is_factorized(self) -> bool:
        """A video model whose blocks attend within frames, then across frames."""
        return self.is_video and self.config.video_attention == "factorized"

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """One sample's shape: ``(3, H, W)``, or ``(T, 3, H, W)`` for a video model."""
        frame = (self.config.channels, self.config.image_size, self.config.image_size)
        return (self.config.num_frames, *frame) if self.is_video else frame

    def as_video(
        self,
        vocabulary: Sequence[str],
        num_frames: int,
        frame_patch: int = 1,
        attention: str = "joint",
        frame_condition: bool = False,
    ) -> ShapesDiT:
        """A video model initialised from this image model, over the word list ``vocabulary``.

        Shared words keep their embeddings (new words get fresh ones), every
        other weight is copied, the patch embedding of a tubelet is the mean of
        its frames' image embeddings (``W_video = [W, ..., W] / frame_patch``),
        every frame of a tubelet starts with the image head (``[W; ...; W]``),
        and the frame embedding starts at zero: on a still clip (every frame the
        same image) the video model returns the image model's velocity in every
        frame; motion and the binding of frames are what video training adds.
        With ``frame_patch > 1`` the frames of a tubelet start averaged
        (symmetric), which training must break: ``frame_patch=1`` starts exactly.
        With ``attention="factorized"`` self-attention stays within each frame
        and the new temporal layers start as the identity, so the video model
        starts as the image model applied to every frame of any clip (with or
        without ``frame_condition``, which starts at zero).
        """
        if self.is_video:
            raise ValueError("this model is already a video model")
        config = ShapesDiTConfig(
            **{
                **asdict(self.config),
                "vocabulary": list(vocabulary),
                "num_frames": num_frames,
                "frame_patch": frame_patch,
                "video_attention": attention,
                "frame_condition": frame_condition,
            }
        )
        video = ShapesDiT(config)
        state = self.state_dict()
        old_rows = state["text_encoder.token_embedding.weight"]
        new_rows = video.text_encoder.token_embedding.weight.detach().clone()
        new_rows[:2] = old_rows[:2]  # padding and begin
        for word in set(config.vocabulary) & set(self.config.vocabulary):
            new_rows[video.tokenizer.token_id(word)] = old_rows[self.tokenizer.token_id(word)]
        state["text_encoder.token_embedding.weight"] = new_rows
        state["patch_embed.weight"] = state["patch_embed.weight"].repeat(1, frame_patch) / frame_patch
        state["final_linear.weight"] = state["final_linear.weight"].repeat(frame_patch, 1)
        state["final_linear.bias"] = state["final_linear.bias"].repeat(frame_patch)
        state["frame_embedding"] = torch.zeros_like(video.frame_embedding)
        fresh = {
            name: value
            for name, value in video.state_dict().items()
            if ".temporal." in name or name == "frame_condition"
        }
        video.load_state_dict({**state, **fresh})
        return video.to(self.position_embedding.device)

    def as_mean_flow(self) -> ShapesDiT:
        """A MeanFlow copy of this flow model: the same weights plus a zero interval embedding, so that
        ``u(x, r, t) = v(x, t)`` until it is trained."""
        if self.config.mean_flow:
            raise ValueError("this model is already a MeanFlow model")
        model = ShapesDiT(ShapesDiTConfig(**{**asdict(self.config), "mean_flow": True}))
        missing, unexpected = model.load_state_dict(self.state_dict(), strict=False)
        assert not unexpected and all(name.startswith("interval_mlp.") for name in missing)
        return model.to(self.position_embedding.device)

    def with_frame_condition(self) -> ShapesDiT:
        """A copy of this video model with a per-frame condition (``frame_condition``) at zero: the same
        function until it is trained, every trained weight kept."""
        return self._video_extended("frame_condition", "frame_condition")

    def with_image_condition(self) -> ShapesDiT:
        """A copy of this video model conditioned on a first frame (``image_condition``), its image embedding
        at zero: the same function, whatever frame it is given, until it is trained."""
        return self._video_extended("image_condition", "image_embed.")

    def _video_extended(self, option: str, new_weights: str) -> ShapesDiT:
        """This video model with the boolean ``option`` switched on; only weights named ``new_weights...``
        are new (and start at zero)."""
        if not self.is_video or getattr(self.config, option):
            raise ValueError(
                f"with_{option} needs a video model without one; this one has num_frames="
                f"{self.config.num_frames}, {option}={getattr(self.config, option)}"
            )
        model = ShapesDiT(ShapesDiTConfig(**{**asdict(self.config), option: True}))
        missing, unexpected = model.load_state_dict(self.state_dict(), strict=False)
        assert not unexpected and missing and all(name.startswith(new_weights) for name in missing)
        return model.to(self.position_embedding.device)

    def _image_tokens(self, image: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | float:
        """``W_y patch([y, m])`` of a first frame ``image`` ``[B, 3, H, W]`` (module docstring); 0 for a model
        without ``image_condition``."""
        if self.image_embed is None:
            if image is not None:
                raise ValueError("a first frame (image) is given, but this model has no image_condition")
            return 0.0
        if image is None or image.shape != (x.shape[0], *x.shape[2:]):
            raise ValueError(
                f"this image-to-video model needs a first frame of shape {(x.shape[0], *x.shape[2:])}, got "
                f"{None if image is None else tuple(image.shape)}"
            )
        clip = x.new_zeros(x.shape[0], x.shape[1], x.shape[2] + 1, *x.shape[3:])
        clip[:, 0, :-1] = image.to(x.dtype)
        clip[:, 0, -1] = 1.0
        return self.image_embed(self._patchify(clip))

    def with_neighbour_window(self, window: int) -> ShapesDiT:
        """A copy of this model whose text encoder has a zero neighbour-word convolution of ``window`` words
        (:class:`TextEncoder`): the same function until it is trained."""
        if self.config.text_neighbour_window:
            raise ValueError(
                f"this model already has text_neighbour_window={self.config.text_neighbour_window}"
            )
        model = ShapesDiT(ShapesDiTConfig(**{**asdict(self.config), "text_neighbour_window": window}))
        missing, unexpected = model.load_state_dict(self.state_dict(), strict=False)
        assert not unexpected and all(name.startswith("text_encoder.neighbour_mixing.") for name in missing)
        if not missing:
            raise ValueError(
                f"text_neighbour_window={window!r} adds nothing; expected an odd integer in [1, 15]"
            )
        return model.to(self.position_embedding.device)

    def encode_prompts(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and mask for prompts, on the model's device. The empty prompt is the unconditional one."""
        ids, mask = self.tokenizer.encode(prompts)
        device = self.position_embedding.device
        return ids.to(device), mask.to(device)

    def encode_text(self, ids: torch.Tensor, mask: torch.Tensor) -> TextContext:
        """The :class:`TextContext` of prompt tokens ``ids, mask``."""
        tokens, pooled = self.text_encoder(ids, mask)
        return TextContext(tokens, pooled, mask)

    def _patchify(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, (T,) C, H, W]`` to tokens ``[B, (T / f) (H / p) (W / p), f C p p]`` (f = frame_patch)."""
        if not self.is_video:
            x = x[:, None]
        batch, frames, channels, height, width = x.shape
        p, f = self.config.patch_size, self.config.frame_patch
        x = x.reshape(batch, frames // f, f, channels, height // p, p, width // p, p)
        x = x.permute(0, 1, 4, 6, 2, 3, 5, 7)
        return x.reshape(batch, (frames // f) * (height // p) * (width // p), f * channels * p * p)

    def _unpatchify(self, tokens: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`_patchify`."""
        batch = tokens.shape[0]
        p, f, channels = self.config.patch_size, self.config.frame_patch, self.config.channels
        grid, groups = self.config.image_size // p, self.config.num_frames // f
        x = tokens.view(batch, groups, grid, grid, f, channels, p, p).permute(0, 1, 4, 5, 2, 6, 3, 7)
        x = x.reshape(batch, groups * f, channels, grid * p, grid * p)
        return x if self.is_video else x[:, 0]

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        ids: torch.Tensor,
        mask: torch.Tensor,
        r: torch.Tensor | None = None,
        text: TextContext | None = None,
        image: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Velocity at ``x`` ``[B, 3, H, W]`` (a clip ``[B, T, 3, H, W]`` for a video model) and time ``t``
        ``[B]`` (or scalar) for prompt tokens ``ids, mask`` (or their ``text`` context from
        :meth:`encode_text`, computed once for many calls); a MeanFlow model returns the average
        velocity over ``[r, t]`` (``r = t`` when not given: ``v``); an image-to-video model takes the
        clip's first frame ``image`` ``[B, 3, H, W]`` (model space)."""
        if t.ndim == 0:
            t = t.expand(x.shape[0])
        if r is not None and self.interval_mlp is None:
            raise ValueError("r (an interval start) is given, but this is not a MeanFlow model")
        text = text if text is not None else self.encode_text(ids, mask)
        embedded_time = self.time_mlp(timestep_embedding(t, 256).to(x.dtype))
        if self.interval_mlp is not None:
            interval = t - (t if r is None else r.expand(x.shape[0]) if r.ndim == 0 else r)
            embedded_time = embedded_time + self.interval_mlp(timestep_embedding(interval, 256).to(x.dtype))
        condition = embedded_time + self.text_to_condition(text.pooled)
        if self.frame_condition is not None:  # [B, D] -> [B, T / frame_patch, D]
            condition = condition[:, None] + self.frame_condition
        condition = F.silu(condition)
        position = self.position_embedding
        if self.frame_embedding is not None:
            position = (position[:, None] + self.frame_embedding).flatten(1, 2)
        tokens = self.patch_embed(self._patchify(x)) + self._image_tokens(image, x) + position
        frames = self.config.num_frames // self.config.frame_patch
        for block in self.blocks:
            tokens = block(tokens, condition, text, frames)
        shift, scale = (
            _per_token(part, tokens.shape[1]) for part in self.final_modulation(condition).chunk(2, -1)
        )
        head = self._unpatchify(self.final_linear(_modulate(self.final_norm(tokens), shift, scale)))
        if self.config.prediction == "velocity":
            return head
        denominator = t.to(x.dtype).clamp(min=self.config.min_time).view(-1, *[1] * (x.ndim - 1))
        return (x - head) / denominator

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` to ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        save_file(
            {name: tensor.detach().cpu().contiguous() for name, tensor in self.state_dict().items()},
            str(directory / WEIGHTS_NAME),
        )

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> ShapesDiT:
        """Load a model written by :meth:`save_pretrained`."""
        directory = Path(directory)
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not (directory / name).is_file():
                raise FileNotFoundError(
                    f"{directory / name} not found: a ShapesDiT directory holds {CONFIG_NAME} and {WEIGHTS_NAME}"
                )
        model = cls(read_model_config(directory / CONFIG_NAME))
        model.load_state_dict(load_file(str(directory / WEIGHTS_NAME)))
        return model
