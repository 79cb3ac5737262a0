"""Tiny random-weight reward backbones for tests and benchmarks.

Each is written to disk, so a reward loads it through exactly the code path of
its real weights; nothing is downloaded.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from open_clip.tokenizer import bytes_to_unicode, default_bpe
from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

import rewards.clip_models  # noqa: F401  (registers the flowrl-tiny-clip architecture)
from rewards.aesthetic import AestheticHead
from rewards.clip_models import open_clip_module

TINY_CLIP = "flowrl-tiny-clip"


def tiny_open_clip_checkpoint(path: Path, wrap_state_dict: bool = False) -> Path:
    """A random ``flowrl-tiny-clip`` state dict saved as an open_clip (or HPS-style) checkpoint."""
    torch.manual_seed(0)
    state = open_clip_module().create_model(TINY_CLIP, pretrained=None).state_dict()
    torch.save({"state_dict": state} if wrap_state_dict else state, path)
    return path


def tiny_aesthetic_head(path: Path, dim: int = 32) -> Path:
    torch.manual_seed(1)
    torch.save(AestheticHead(dim).state_dict(), path)
    return path


def offline_clip_tokenizer(directory: Path) -> Path:
    """A transformers CLIPTokenizer rebuilt from open_clip's bundled BPE vocabulary (as SimpleTokenizer does)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = gzip.open(default_bpe()).read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    merges = [tuple(line.split()) for line in lines]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [token + "</w>" for token in vocab] + ["".join(merge) for merge in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    (directory / "vocab.json").write_text(json.dumps({token: index for index, token in enumerate(vocab)}))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    tokenizer = CLIPTokenizer(
        str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=77
    )
    tokenizer.save_pretrained(directory)
    return directory


def tiny_pickscore_model(directory: Path) -> Path:
    """A random tiny transformers ``CLIPModel`` saved with ``save_pretrained``."""
    torch.manual_seed(2)
    config = CLIPConfig(
        text_config=dict(
            hidden_size=32,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=49408,
            bos_token_id=49406,
            eos_token_id=49407,
            pad_token_id=49407,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            image_size=32,
            patch_size=8,
        ),
        projection_dim=32,
    )
    CLIPModel(config).save_pretrained(directory)
    return directory
