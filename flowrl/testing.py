"""Tiny random-weight diffusers pipelines built in code, fully offline.

As diffusers tests its own pipelines: every component (transformer, VAE,
text encoders, tokenizers) is built from a small config with seeded random
weights, nothing comes from a hub. They prove the SD3 and FLUX code paths
(prompt encoding, packing, LoRA, saving, ``load_lora_weights``) where no real
checkpoint can be downloaded; they generate noise-like images (and videos).

Tokenizers: the CLIP tokenizer is rebuilt from open_clip's bundled BPE file
(the same vocabulary and merges as OpenAI CLIP's, so ids equal the real
tokenizer's); the T5 (and Wan's UMT5) stand-in is a word-level ``tokenizers``
model over the shapes grammar's words (unknown words map to ``<unk>``), ending
each sequence with ``</s>`` as T5 does.

``python -m flowrl.testing sd3 DIR`` (or ``flux``, ``wan``) writes a tiny
pipeline directory that ``model.name`` can point at.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
from pathlib import Path

import torch

from flowrl.shapes.grammar import vocabulary

#: the tiny image pipelines (scripts/bench_models.py trains each with an image reward)
KINDS = ("sd3", "flux")
VIDEO_KINDS = ("wan",)
CLIP_MAX_LENGTH = 77


def clip_tokenizer():
    """OpenAI CLIP's BPE tokenizer as a ``transformers.CLIPTokenizer``, from open_clip's bundled vocabulary."""
    import open_clip
    from open_clip.tokenizer import bytes_to_unicode
    from transformers import CLIPTokenizer

    bpe_path = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    lines = gzip.open(bpe_path).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 49152 - 256 - 2 + 1]]
    byte_tokens = list(bytes_to_unicode().values())
    tokens = byte_tokens + [token + "</w>" for token in byte_tokens]
    tokens += ["".join(merge) for merge in merges] + ["<|startoftext|>", "<|endoftext|>"]
    with tempfile.TemporaryDirectory() as directory:
        vocab_file, merges_file = Path(directory, "vocab.json"), Path(directory, "merges.txt")
        vocab_file.write_text(json.dumps({token: index for index, token in enumerate(tokens)}))
        merges_file.write_text("#version: 0.2\n" + "\n".join(" ".join(merge) for merge in merges) + "\n")
        return CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=CLIP_MAX_LENGTH)


def word_tokenizer(max_length: int = 32):
    """A T5-like tokenizer: word level over the shapes words, ``<pad>`` = 0, ``</s>`` = 1, ``<unk>`` = 2."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<unk>", *vocabulary()]
    tokenizer = Tokenizer(
        models.WordLevel({word: index for index, word in enumerate(words)}, unk_token="<unk>")
    )
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=max_length,
    )


def _clip_text_encoder(hidden_size: int, projection_dim: int, with_projection: bool = True):
    """SD3's CLIP encoders have a projection head (``CLIPTextModelWithProjection``), FLUX's does not."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        bos_token_id=49406,
        eos_token_id=49407,
        pad_token_id=49407,
        hidden_size=hidden_size,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
        vocab_size=49408,
        projection_dim=projection_dim,
        max_position_embeddings=CLIP_MAX_LENGTH,
    )
    return CLIPTextModelWithProjection(config) if with_projection else CLIPTextModel(config)


def _t5_encoder(d_model: int = 32, umt5: bool = False):
    """A T5 encoder stand-in over the word tokenizer's vocabulary; ``umt5``: Wan's encoder class (UMT5)."""
    import transformers

    prefix = "UMT5" if umt5 else "T5"
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=len(vocabulary()) + 3,
        d_model=d_model,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return getattr(transformers, f"{prefix}EncoderModel")(config)


def _vae(latent_channels: int):
    """A one-downsampling VAE (factor 2): 32x32 images, 16x16 latents."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4, 8),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )


def tiny_sd3_pipeline(seed: int = 0):
    """A random-weight ``StableDiffusion3Pipeline`` (two CLIP encoders, a T5, MM-DiT, VAE) for 32x32 images."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        out_channels=4,
        pos_embed_max_size=16,
    )
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_vae(latent_channels=4),
        text_encoder=_clip_text_encoder(32, 32),
        tokenizer=clip_tokenizer(),
        text_encoder_2=_clip_text_encoder(32, 32),
        tokenizer_2=clip_tokenizer(),
        text_encoder_3=_t5_encoder(),
        tokenizer_3=word_tokenizer(),
    )


def tiny_flux_pipeline(seed: int = 0):
    """A random-weight ``FluxPipeline`` (CLIP + T5, guidance-distilled MM-DiT, VAE) for 32x32 images."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=[4, 4, 8],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    return FluxPipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=_vae(latent_channels=4),
        text_encoder=_clip_text_encoder(32, 32, with_projection=False),
        tokenizer=clip_tokenizer(),
        text_encoder_2=_t5_encoder(),
        tokenizer_2=word_tokenizer(),
    )


def tiny_wan_pipeline(seed: int = 0):
    """A random-weight Wan 2.1 ``WanPipeline`` (UMT5, a 2-block video DiT, the causal video VAE with Wan's
    8x spatial and 4x temporal downsampling) and the UniPC flow scheduler with shift 3.0 as Wan 2.1 ships it;
    32x32 videos of ``4k+1`` frames."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
    )
    return WanPipeline(
        tokenizer=word_tokenizer(),
        text_encoder=_t5_encoder(umt5=True),
        vae=vae,
        scheduler=scheduler,
        transformer=transformer,
    )


def tiny_pipeline(kind: str, seed: int = 0):
    """The tiny pipeline of ``kind`` (``sd3``, ``flux`` or ``wan``)."""
    builders = {"sd3": tiny_sd3_pipeline, "flux": tiny_flux_pipeline, "wan": tiny_wan_pipeline}
    if kind not in builders:
        raise ValueError(f"unknown tiny model kind {kind!r}; allowed: {list(builders)}")
    return builders[kind](seed)


def save_tiny_pipeline(kind: str, directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny pipeline of ``kind`` to ``directory`` (loadable with ``from_pretrained``)."""
    directory = Path(directory)
    tiny_pipeline(kind, seed).save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a tiny random-weight diffusers pipeline directory.")
    parser.add_argument("kind", choices=(*KINDS, *VIDEO_KINDS))
    parser.add_argument("directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(save_tiny_pipeline(args.kind, args.directory, args.seed))


if __name__ == "__main__":
    main()
