"""The settings of shapes-world pretraining (:mod:`flowrl.pretrain`), a leaf module: the command line reads
its fields as flags without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

TIME_SAMPLINGS = ("uniform", "logit_normal")
OBJECTIVES = ("flow", "meanflow")
WORLDS = ("shapes", "video_shapes")


@dataclass
class PretrainConfig:
    """Settings of :func:`pretrain` (also written to ``pretrain.json``); defaults made the shipped model."""

    steps: int = 5000  #: optimizer steps
    batch_size: int = 64  #: freshly rendered images per step
    learning_rate: float = 1e-3  #: peak AdamW learning rate
    min_learning_rate_ratio: float = 0.1  #: cosine decay ends at this share of the peak
    warmup_steps: int = 200  #: linear warm-up steps
    weight_decay: float = 0.0  #: AdamW weight decay
    ema_decay: float = 0.999  #: decay of the saved weight average (warmed up as (1+k)/(10+k))
    condition_dropout: float = 0.1  #: share of prompts replaced by "" (for classifier-free guidance)
    grad_clip: float = 1.0  #: max global gradient norm
    seed: int = 0  #: seed of every random draw (prompts, layouts, t, noise, initial weights)
    patch_size: int = 4  #: ShapesDiT pixel patch side
    hidden_size: int = 128  #: ShapesDiT width
    depth: int = 6  #: ShapesDiT blocks
    num_heads: int = 4  #: ShapesDiT attention heads
    text_hidden_size: int = 128  #: text encoder width
    text_layers: int = 2  #: text encoder layers
    prediction: str = "sample"  #: ShapesDiT output: "velocity" or "sample" (x-prediction, same v-loss)
    time_sampling: str = "logit_normal"  #: "uniform" or "logit_normal"
    time_mean: float = 0.8  #: m of the logit-normal time (> 0: more steps at high noise)
    time_std: float = 0.8  #: s of the logit-normal time
    objective: str = "flow"  #: "flow" (flow matching) or "meanflow" (a MeanFlow model, see module docstring)
    init_from: str = ""  #: start from this shapes model (shipped name or directory) instead of from scratch
    meanflow_equal_share: float = 0.5  #: meanflow: share of samples with r = t (plain flow matching)
    meanflow_zero_share: float = 0.25  #: meanflow: share of samples with r = 0 (one-step jumps)
    meanflow_adaptive_p: float = 1.0  #: meanflow: power p of the adaptive loss weight (0 = plain MSE)
    world: str = "shapes"  #: "shapes" (images) or "video_shapes" (moving-shapes clips)
    num_frames: int = 8  #: video_shapes: frames per clip
    frame_patch: int = 1  #: video_shapes: frames per token (tubelet depth)
    video_attention: str = (
        "joint"  #: video_shapes: "joint" space-time attention or "factorized" (frame, then time)
    )
    save_every: int = 0  #: also save the EMA weights every this many steps (0: only at the end)
