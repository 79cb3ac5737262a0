"""The settings of shapes-world pretraining (:mod:`flowrl.pretrain`), a leaf module: the command line reads
its fields as flags without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from flowrl.config_schema import at_least, choice

MIXED_PRECISIONS = ("auto", "no", "bf16")  # flowrl.precision's values, kept here so this module stays a leaf

TIME_SAMPLINGS = ("uniform", "logit_normal")
OBJECTIVES = ("flow", "meanflow")
WORLDS = ("shapes", "video_shapes", "video_shapes_i2v")


@dataclass
class PretrainConfig:
    """Settings of :func:`pretrain` (also written to ``pretrain.json``); defaults made the shipped model."""

    steps: int = field(default=5000, metadata=at_least(1))  #: optimizer steps
    batch_size: int = field(default=64, metadata=at_least(1))  #: freshly rendered images per step
    #: peak AdamW learning rate
    learning_rate: float = field(default=1e-3, metadata=at_least(0.0, strict=True))
    min_learning_rate_ratio: float = 0.1  #: cosine decay ends at this share of the peak
    warmup_steps: int = field(default=200, metadata=at_least(0))  #: linear warm-up steps
    weight_decay: float = 0.0  #: AdamW weight decay
    ema_decay: float = 0.999  #: decay of the saved weight average (warmed up as (1+k)/(10+k))
    condition_dropout: float = 0.1  #: share of prompts replaced by "" (for classifier-free guidance)
    grad_clip: float = 1.0  #: max global gradient norm
    #: seed of every random draw (prompts, layouts, t, noise, initial weights)
    seed: int = field(default=0, metadata=at_least(0))
    patch_size: int = field(default=4, metadata=at_least(1))  #: ShapesDiT pixel patch side
    hidden_size: int = field(default=128, metadata=at_least(1))  #: ShapesDiT width
    depth: int = field(default=6, metadata=at_least(1))  #: ShapesDiT blocks
    num_heads: int = field(default=4, metadata=at_least(1))  #: ShapesDiT attention heads
    text_hidden_size: int = field(default=128, metadata=at_least(1))  #: text encoder width
    text_layers: int = field(default=2, metadata=at_least(1))  #: text encoder layers
    #: width (odd) of the text encoder's neighbour-word convolution (ShapesDiT's word order), 0 for none;
    #: with ``init_from`` a model without one gets a zero one (the same function to start)
    text_neighbour_window: int = field(default=0, metadata=at_least(0))
    #: ShapesDiT output: "velocity" or "sample" (x-prediction, same v-loss)
    prediction: str = field(default="sample", metadata=choice("velocity", "sample"))
    #: "uniform" or "logit_normal"
    time_sampling: str = field(default="logit_normal", metadata=choice(*TIME_SAMPLINGS))
    time_mean: float = 0.8  #: m of the logit-normal time (> 0: more steps at high noise)
    time_std: float = 0.8  #: s of the logit-normal time
    #: "flow" (flow matching) or "meanflow" (a MeanFlow model, see module docstring)
    objective: str = field(default="flow", metadata=choice(*OBJECTIVES))
    init_from: str = ""  #: start from this shapes model (shipped name or directory) instead of from scratch
    meanflow_equal_share: float = 0.5  #: meanflow: share of samples with r = t (plain flow matching)
    meanflow_zero_share: float = 0.25  #: meanflow: share of samples with r = 0 (one-step jumps)
    meanflow_adaptive_p: float = 1.0  #: meanflow: power p of the adaptive loss weight (0 = plain MSE)
    #: "shapes" (images), "video_shapes" (moving-shapes clips) or "video_shapes_i2v" (the same clips, the model
    #: given each clip's frame 0: an image-to-video model; from a video model it adds ``image_condition``)
    world: str = field(default="shapes", metadata=choice(*WORLDS))
    num_frames: int = field(default=8, metadata=at_least(1))  #: video_shapes: frames per clip
    #: video_shapes: frames per token (tubelet depth)
    frame_patch: int = field(default=1, metadata=at_least(1))
    video_attention: str = (
        "joint"  #: video_shapes: "joint" space-time attention or "factorized" (frame, then time)
    )
    #: video_shapes: a learned per-frame term in every block's adaLN condition (zero to start); with
    #: ``init_from`` a video model without one gets it added
    frame_condition: bool = False
    #: also save the EMA weights every this many steps (0: only at the end)
    save_every: int = field(default=0, metadata=at_least(0))
    #: write a resumable checkpoint (weights, average, optimizer, random states) every this many steps
    #: to ``<out>/checkpoints`` (0: none); ``--resume`` continues from the newest, bit for bit
    checkpoint_every: int = field(default=0, metadata=at_least(0))
    #: "auto" (bfloat16 autocast where this CPU has bfloat16 matrix instructions, else float32), "bf16" or
    #: "no" (float32); the resolved value is what ``pretrain.json`` and the checkpoints record
    mixed_precision: str = field(default="auto", metadata=choice(*MIXED_PRECISIONS))
