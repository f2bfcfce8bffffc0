"""Build the embedded tiny Wan text-to-video pipeline (and tiny CogVideoX, LTX and HunyuanVideo ones).

The tiny model uses the same diffusers/transformers classes as Wan2.1-T2V-1.3B
(WanTransformer3DModel, AutoencoderKLWan, UMT5EncoderModel, a fast tokenizer and the
flow-matching UniPC scheduler Wan2.1 ships), with explicit small configs and weights
drawn from a seeded generator. It is written with ``save_pretrained`` and loaded back
by generation through ``DiffusionPipeline.from_pretrained``, the same path a real
checkpoint takes, so generation has no branch for it.

The build is byte-reproducible: weights come from one seeded ``torch.Generator``
visited in parameter-name order, and every file diffusers writes is deterministic.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..atomic import replace_dir
from ..errors import ConfigError, ModelBuildError
from .generate import no_load_bars

# Lazy on purpose: torch, diffusers and transformers are imported inside the builders: the CLI imports this
# module without them.

if TYPE_CHECKING:
    import torch
    from diffusers.pipelines.pipeline_utils import DiffusionPipeline
    from transformers import PreTrainedTokenizerFast

_T = TypeVar("_T")

TINY_SEED = 20261129
"""Seed of the tiny model's weights; part of its identity."""

_TRANSFORMER = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
    out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=4,
    cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
)
_VAE = dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
            temperal_downsample=[False, True, True])
# Any: transformers' config classes type each keyword differently.
_TEXT: dict[str, Any] = dict(vocab_size=259, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2,
                             relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
                             decoder_start_token_id=0)
MAX_TEXT_TOKENS = 64
"""Tokens the tiny text encoder sees per prompt (pass as ``max_sequence_length``)."""


def _tokenizer() -> PreTrainedTokenizerFast:
    # A byte-level BPE with no merges: every prompt, in any script, maps to tokens
    # offline; no vocabulary file has to be downloaded.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    vocab.update({ch: i + 3 for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
        model_max_length=MAX_TEXT_TOKENS)


def _checked(obj: object, cls: type[_T]) -> _T:
    """``obj`` as the ``cls`` it is. To mypy, ``from diffusers import X`` names diffusers'
    torch-less placeholder class (its ``__init__`` binds those first), which is neither a
    torch Module nor a DiffusionPipeline; this check makes the type true, not assumed."""
    if not isinstance(obj, cls):
        raise ModelBuildError(f"diffusers gave a {type(obj).__name__} where a {cls.__name__} was expected; "
                              "the checkpoint's model_index.json names other classes or diffusers is broken: "
                              "rebuild the model (rule build_tiny_model) or reinstall the environment")
    return obj


def _module(model: object) -> torch.nn.Module:
    import torch

    return _checked(model, torch.nn.Module)


def _pipeline(pipe: object) -> DiffusionPipeline:
    from diffusers.pipelines.pipeline_utils import DiffusionPipeline

    return _checked(pipe, DiffusionPipeline)


def _reseed(module: object, generator: torch.Generator) -> None:
    import torch

    with torch.no_grad():
        for name, param in sorted(_module(module).named_parameters()):
            std = 0.02 if param.dim() > 1 else 0.0
            if name.endswith("weight") and param.dim() == 1:
                param.fill_(1.0)  # norm scales
            elif std:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
            else:
                param.zero_()


FAMILIES = ("wan", "cogvideox", "ltx", "hunyuanvideo")
"""Text-to-video families the tiny builder makes (``pairflow build-tiny-model --family``)."""

# CogVideoX and LTX at the sizes diffusers' own pipeline tests use, so a test of PairFlow
# exercises what a user's checkpoint of that family does (a text length the transformer
# caps, another VAE, another scheduler) in seconds on a CPU.
_COGVIDEOX = dict(num_attention_heads=4, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2,
                  text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=9, patch_size=2,
                  temporal_compression_ratio=4, max_text_seq_length=16)
_COGVIDEOX_VAE = dict(in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
                      up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), latent_channels=4,
                      layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4)
_LTX = dict(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
            cross_attention_dim=32, num_layers=2, caption_channels=32)
_LTX_VAE = dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
                decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
                decoder_spatio_temporal_scaling=(True, True, False, False),
                decoder_inject_noise=(False, False, False, False, False),
                upsample_residual=(False, False, False, False),
                upsample_factor=(1, 1, 1, 1), timestep_conditioning=False, patch_size=1, patch_size_t=1,
                encoder_causal=True, decoder_causal=False)


_HUNYUAN = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
                num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
                text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4))
_HUNYUAN_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
                    up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
                    act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
                    temporal_compression_ratio=4, mid_block_add_attention=True)


def _wan(gen: torch.Generator) -> DiffusionPipeline:
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    transformer = WanTransformer3DModel(**_TRANSFORMER)
    vae = AutoencoderKLWan(**_VAE)
    text_encoder = UMT5EncoderModel(UMT5Config(**_TEXT))
    for module in (transformer, vae, text_encoder):
        _reseed(module, gen)
    # Larger weights in the denoiser and the VAE decoder, so that sampling really moves
    # the latents and decoded videos have visible structure (and caches visibly act).
    with torch.no_grad():
        for part, std in ((_module(transformer), 0.3), (_module(vae).get_submodule("decoder"), 0.3)):
            for _name, param in sorted(part.named_parameters()):
                if param.dim() > 1:
                    param.copy_(torch.randn(param.shape, generator=gen) * std)
    # Wan2.1's scheduler: UniPC with flow sigmas (its scheduler_config.json).
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
        num_train_timesteps=1000)
    pipe = WanPipeline(tokenizer=_tokenizer(), text_encoder=text_encoder, vae=vae,
                       transformer=transformer, scheduler=scheduler)
    return _pipeline(pipe)


def _cogvideox(gen: torch.Generator) -> DiffusionPipeline:
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXPipeline, CogVideoXTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    transformer = CogVideoXTransformer3DModel(**_COGVIDEOX)
    vae = AutoencoderKLCogVideoX(**_COGVIDEOX_VAE)
    text_encoder = T5EncoderModel(T5Config(**_TEXT))
    for module in (transformer, vae, text_encoder):
        _reseed(module, gen)
    pipe = CogVideoXPipeline(tokenizer=_tokenizer(), text_encoder=text_encoder, vae=vae, transformer=transformer,
                             scheduler=CogVideoXDDIMScheduler())
    return _pipeline(pipe)


def _ltx(gen: torch.Generator) -> DiffusionPipeline:
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )
    from transformers import T5Config, T5EncoderModel

    transformer = LTXVideoTransformer3DModel(**_LTX)
    vae = AutoencoderKLLTXVideo(**_LTX_VAE)
    text_encoder = T5EncoderModel(T5Config(**_TEXT))
    for module in (transformer, vae, text_encoder):
        _reseed(module, gen)
    pipe = LTXPipeline(tokenizer=_tokenizer(), text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler())
    return _pipeline(pipe)


def _hunyuanvideo(gen: torch.Generator) -> DiffusionPipeline:
    # HunyuanVideo: a Llama text encoder (its prompt template is cropped off), a CLIP text
    # encoder for the pooled embedding, embedded guidance, a causal 3D VAE.
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    transformer = HunyuanVideoTransformer3DModel(**_HUNYUAN)
    vae = AutoencoderKLHunyuanVideo(**_HUNYUAN_VAE)
    text_encoder = LlamaModel(LlamaConfig(vocab_size=259, hidden_size=16, intermediate_size=37, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                                          pad_token_id=0))
    text_encoder_2 = CLIPTextModel(CLIPTextConfig(
        vocab_size=259, hidden_size=8, intermediate_size=37, projection_dim=8, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=77, pad_token_id=0, eos_token_id=1, bos_token_id=2))
    for module in (transformer, vae, text_encoder, text_encoder_2):
        _reseed(module, gen)
    tokenizer_2 = _tokenizer()
    tokenizer_2.model_max_length = 77  # CLIP's positions
    pipe = HunyuanVideoPipeline(text_encoder=text_encoder, tokenizer=_tokenizer(), transformer=transformer, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=text_encoder_2,
                                tokenizer_2=tokenizer_2)
    return _pipeline(pipe)


def build_tiny_model(out_dir: Path, family: str = "wan") -> Path:
    """Build a tiny pipeline of ``family`` (one of ``FAMILIES``; the embedded model is
    ``wan``) and save it to ``out_dir`` (atomically replaced).

    Returns the directory. Raises ConfigError for an unknown family; diffusers errors propagate.
    """
    import torch

    builders = {"wan": _wan, "cogvideox": _cogvideox, "ltx": _ltx, "hunyuanvideo": _hunyuanvideo}
    if family not in builders:
        raise ConfigError(f"tiny model family {family!r} is not one of {list(FAMILIES)}")
    pipe = builders[family](torch.Generator().manual_seed(TINY_SEED))
    with replace_dir(out_dir) as tmp, no_load_bars():
        pipe.save_pretrained(tmp, safe_serialization=True)
    return out_dir


__all__ = ["FAMILIES", "MAX_TEXT_TOKENS", "TINY_SEED", "build_tiny_model"]
