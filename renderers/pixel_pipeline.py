"""A small text-conditional pixel-space diffusion pipeline, trained from scratch (the offline pack's renderer).

``PixelTextToImagePipeline`` denoises RGB pixels directly (no VAE). A ``UNet2DConditionModel`` reads the
noisy image (B, 3, H, W) and the timestep, attends to the text encoder's hidden states (B, L, D), and
gets the pooled sentence embedding (B, D) added to its time embedding. The text encoder is a small
``CLIPTextModel`` over the word-level tokenizer of ``world_model.text.word_tokenizer``. The UNet predicts the
clean image (``prediction_type="sample"``: a small network learns the few-dimensional clean strips
much faster than the full-dimensional noise or velocity) on a cosine noise schedule; the pipeline
samples with stochastic DPM-Solver++ from pure noise ("trailing" timesteps; the scheduler's noise comes
from the call's generator, so a seed gives one image) and classifier-free guidance, the
empty prompt being the unconditional input (training drops the text with some probability).

Options, saved with the pipeline: ``patch_size`` p > 1 runs the UNet on p x p pixel patches stacked as
channels (``pixel_unshuffle``: (B, 3, H, W) -> (B, 3 p^2, H / p, W / p), back with ``pixel_shuffle``),
about p^2 times cheaper, while the scheduler still denoises RGB pixels; ``strip_frames`` n > 0 (an
image is n frames side by side, like the state strips) adds three coordinate channels to the UNet's
input (row, column within the frame, frame index), so it need not infer from the borders where in
each frame it draws.

    from renderers.pixel_pipeline import PixelTextToImagePipeline
    pipe = PixelTextToImagePipeline.from_pretrained("offline_pack/renderer")
    image = pipe("the small red ball falls toward the floor.", generator=torch.Generator().manual_seed(0)).images[0]

``build_pixel_pipeline`` makes a randomly initialised one for training (``pipeline.pack.train_renderer``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import DiffusionPipeline, ImagePipelineOutput, UNet2DConditionModel
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image
from transformers import CLIPTextConfig, CLIPTextModel, PreTrainedTokenizerBase

from renderers.pixel_scheduler import make_scheduler
from world_model.data.synthetic.simulation import STATE_FRAMES, STRIP_SIZE
from world_model.text.word_tokenizer import build_word_tokenizer
from world_model.utils.cli import check_range


@dataclass
class PixelPipelineConfig:
    """Sizes of a ``PixelTextToImagePipeline`` built from scratch."""

    frame_size: int = STRIP_SIZE[0]  # pixels a side of one frame of a state strip: it renders and trains on
    # strips of (frame_size, STATE_FRAMES * frame_size) pixels
    sample_size: tuple[int, int] | None = field(  # (height, width) in pixels of the images it renders by default
        default=None,  # None: a state strip of frame_size frames
        metadata={"flag": False},  # follows --frame-size; set directly only to build other shapes
    )
    patch_size: int = 2  # the UNet sees patch_size x patch_size pixel patches as 3 * patch_size**2 channels
    strip_frames: int = 0  # frames side by side in an image, read as coordinate channels (0: none)
    previous_strip: bool = False  # the UNet also reads the strip of the second before (what it continues)
    block_out_channels: tuple[int, ...] = (32, 64, 128)  # one UNet level each; every level after the first halves H, W
    layers_per_block: int = 1
    attention_levels: int = 2  # the last (coarsest) levels with cross-attention to the text, besides the middle block
    self_attention_levels: int = 1  # of those, the last ones whose attention blocks also attend over the image
    head_channels: int = 32
    scale_shift: bool = False  # the time + sentence embedding scales and shifts ResNet features (else shifts them)
    text_dim: int = 128
    text_layers: int = 2
    text_heads: int = 4
    max_text_length: int = 24
    num_train_timesteps: int = 1000
    prediction_type: str = "sample"  # what the UNet outputs: "sample" (the clean image) or "v_prediction"
    num_inference_steps: int = 15
    guidance_scale: float = 1.5  # chosen by pipeline.pack.round_trip over 1-5 for the shipped renderer
    solver: str = "sde-dpmsolver++"  # one of SOLVERS; the stochastic one, chosen by pipeline.pack.round_trip

    def __post_init__(self) -> None:
        check_range("--frame-size", self.frame_size, 1)
        if self.sample_size is None:
            self.sample_size = (self.frame_size, STATE_FRAMES * self.frame_size)
        self.sample_size = tuple(self.sample_size)
        self.block_out_channels = tuple(self.block_out_channels)
        if not self.block_out_channels or min(self.block_out_channels) < 1:
            raise ValueError(f"--block-out-channels must be one or more positive widths, got {self.block_out_channels}")
        for name in ("patch_size", "layers_per_block", "head_channels", "text_dim", "text_layers", "text_heads",
                     "max_text_length", "num_train_timesteps", "num_inference_steps"):  # fmt: skip
            check_range(f"--{name.replace('_', '-')}", getattr(self, name), 1)
        levels = len(self.block_out_channels)
        if not 0 <= self.self_attention_levels <= self.attention_levels <= levels:
            raise ValueError(
                f"need 0 <= --self-attention-levels <= --attention-levels <= {levels} (the levels of "
                f"--block-out-channels), got {self.self_attention_levels} and {self.attention_levels}"
            )


class PixelTextToImagePipeline(DiffusionPipeline):
    """Text -> (H, W, 3) RGB images, denoised in pixel space.

    Components: ``unet`` (``UNet2DConditionModel`` with 3 * patch_size**2 out channels, as many in
    channels plus 3 coordinate channels when ``strip_frames`` > 0, and its ``sample_size`` in patches,
    ``class_embed_type="projection"`` fed with the pooled text embedding),
    ``scheduler`` (any diffusers scheduler whose ``prediction_type`` is the UNet's), ``text_encoder``
    (``CLIPTextModel``) and ``tokenizer`` (word-level; prompts become [BOS] words [EOS] [PAD]...).
    ``default_num_inference_steps`` and ``default_guidance_scale`` are the sampling settings used when a
    call leaves them ``None``; they, ``patch_size`` and ``strip_frames`` are saved in ``model_index.json``.
    """

    model_cpu_offload_seq = "text_encoder->unet"

    def __init__(
        self,
        unet: UNet2DConditionModel,
        scheduler: SchedulerMixin,
        text_encoder: CLIPTextModel,
        tokenizer: PreTrainedTokenizerBase,
        default_num_inference_steps: int = 15,
        default_guidance_scale: float = 3.0,
        patch_size: int = 1,
        strip_frames: int = 0,
        previous_strip: bool = False,
    ):
        super().__init__()
        channels = 3 * patch_size**2
        expected = (channels * (2 if previous_strip else 1) + (3 if strip_frames else 0), channels)
        if (unet.config.in_channels, unet.config.out_channels) != expected:
            raise ValueError(
                f"patch_size {patch_size}, strip_frames {strip_frames} and previous_strip {previous_strip} need a UNet with "
                f"{expected[0]}/{expected[1]} in/out channels, got "
                f"{unet.config.in_channels}/{unet.config.out_channels}"
            )
        self.register_modules(unet=unet, scheduler=scheduler, text_encoder=text_encoder, tokenizer=tokenizer)
        self.register_to_config(
            default_num_inference_steps=default_num_inference_steps,
            default_guidance_scale=default_guidance_scale,
            patch_size=patch_size,
            strip_frames=strip_frames,
            previous_strip=previous_strip,
        )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs) -> PixelTextToImagePipeline:
        """``DiffusionPipeline.from_pretrained``, in float32 unless ``dtype`` is given (the pack is saved in
        float16, which CPUs run slowly)."""
        if "torch_dtype" not in kwargs:
            kwargs.setdefault("dtype", torch.float32)
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @property
    def size_multiple(self) -> int:
        """Height and width must be multiples of this: the patch size times 2 for each UNet level after the first."""
        return self.config.patch_size * 2 ** (len(self.unet.config.block_out_channels) - 1)

    def check_size(self, height: int | None, width: int | None) -> tuple[int, int]:
        """``(height, width)``, each defaulting to the UNet's ``sample_size``; raises ``ValueError`` for a
        size the UNet cannot take (not a positive multiple of ``size_multiple``)."""
        size, p = self.unet.config.sample_size, self.config.patch_size
        default_height, default_width = (p * size, p * size) if isinstance(size, int) else (p * size[0], p * size[1])
        height = default_height if height is None else height
        width = default_width if width is None else width
        m = self.size_multiple
        for name, value in (("height", height), ("width", width)):
            if not isinstance(value, (int, np.integer)) or value <= 0 or value % m:
                raise ValueError(
                    f"{name} must be a positive multiple of {m} (patches of {p} pixels that the "
                    f"UNet halves {len(self.unet.config.block_out_channels) - 1} times), got "
                    f"{value!r}; the trained size is {default_height}x{default_width}"
                )
        return int(height), int(width)

    def tokenize(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Prompts -> ``input_ids`` and ``attention_mask`` (B, max_length): [BOS] words [EOS] then [PAD]s.
        Words past ``max_length - 2`` are dropped; unknown words become [UNK]."""
        tokenizer = self.tokenizer
        length = tokenizer.model_max_length
        rows = [
            [
                tokenizer.bos_token_id,
                *tokenizer(p, add_special_tokens=False)["input_ids"][: length - 2],
                tokenizer.eos_token_id,
            ]
            for p in prompts
        ]
        ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        return {"input_ids": ids, "attention_mask": (ids != tokenizer.pad_token_id).long()}

    def encode_prompt(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prompts -> hidden states (B, L, D), their attention mask (B, L) and the pooled [EOS] state (B, D)."""
        tokens = {k: v.to(self.text_encoder.device) for k, v in self.tokenize(prompts).items()}
        output = self.text_encoder(**tokens)
        return output.last_hidden_state, tokens["attention_mask"], output.pooler_output

    def predict(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | int,
        text: tuple[torch.Tensor, ...],
        previous: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The UNet's output (B, 3, H, W) for noisy images ``sample`` (B, 3, H, W) given ``encode_prompt`` output and,
        for a pipeline with ``previous_strip``, the strips they continue, ``previous`` (B, 3, H, W) in [-1, 1] (None or
        zeros: none)."""
        hidden, mask, pooled = text
        p = self.config.patch_size
        if self.config.get("previous_strip", False):
            sample = torch.cat([sample, torch.zeros_like(sample) if previous is None else previous.to(sample)], dim=1)
        patches = F.pixel_unshuffle(sample, p) if p > 1 else sample  # (B, C p^2, H / p, W / p)
        if self.config.strip_frames:
            patches = torch.cat([patches, self.coordinates(patches)], dim=1)
        output = self.unet(
            patches, timestep, encoder_hidden_states=hidden, encoder_attention_mask=mask, class_labels=pooled
        ).sample
        return F.pixel_shuffle(output, p) if p > 1 else output

    def image_batch(self, images: list[np.ndarray], count: int, height: int, width: int, name: str) -> torch.Tensor:
        """``count`` (H', W', 3) uint8 RGB images -> (count, 3, height, width) in [-1, 1] (bilinear resize)."""
        if len(images) != count:
            raise ValueError(f"{len(images)} {name} images for {count} prompts")
        resized = [
            np.asarray(Image.fromarray(np.asarray(i, dtype=np.uint8)).resize((width, height), Image.BILINEAR))
            for i in images
        ]
        batch = torch.from_numpy(np.stack(resized)).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
        return batch.to(self.device, self.unet.dtype)

    def coordinates(self, patches: torch.Tensor) -> torch.Tensor:
        """Coordinate channels (B, 3, h, w) for a batch of (B, C, h, w) patch grids: the row, the column within
        its frame and the frame index (of ``strip_frames`` side by side), each in [-1, 1]."""
        batch, _, h, w = patches.shape
        n = self.config.strip_frames
        column = torch.arange(w, device=patches.device, dtype=torch.float32)
        frame = torch.div(column * n, w, rounding_mode="floor")
        within = (column - frame * w / n + 0.5) / (w / n)  # (0, 1)
        row = torch.linspace(-1, 1, h, device=patches.device)
        maps = torch.stack(
            [
                row[:, None].expand(h, w),
                (2 * within - 1)[None].expand(h, w),
                (2 * frame / max(n - 1, 1) - 1)[None].expand(h, w),
            ]
        )
        return maps.to(patches.dtype).expand(batch, 3, h, w)

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        height: int | None = None,
        width: int | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        output_type: str = "np",
        return_dict: bool = True,
        previous: list[np.ndarray] | None = None,
        image: list[np.ndarray] | None = None,
        strength: float = 1.0,
    ) -> ImagePipelineOutput | tuple:
        """Render one image per prompt.

        Args:
            prompt: a sentence or a list of sentences.
            height, width: output size in pixels (default: the UNet's ``sample_size``, 48 x 144 for the
                offline pack); positive multiples of ``size_multiple``.
            num_inference_steps: denoising steps (default ``config.default_num_inference_steps``).
            guidance_scale: classifier-free guidance weight w, output = uncond + w (cond - uncond);
                w <= 1 runs the conditional model alone (default ``config.default_guidance_scale``).
            generator: torch generator(s) for the initial noise (one per prompt, or one for all).
            output_type: ``"np"`` (a (B, H, W, 3) float array in [0, 1]) or ``"pil"`` (a list of images).
            return_dict: return an ``ImagePipelineOutput`` (else a one-element tuple).
            previous: for a pipeline with ``previous_strip``, the strip each image continues, one (H', W', 3) uint8
                RGB image per prompt (resized to the output size); None renders without one.
            image, strength: start from these images (one (H', W', 3) uint8 RGB image per prompt) noised to
                ``strength`` in (0, 1] of the schedule, running that fraction of the steps (SDEdit); 1 or no
                ``image``: from pure noise.
        """
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"prompt must be a string or a non-empty list of strings, got {prompt!r}")
        if output_type not in ("np", "pil"):
            raise ValueError(f"output_type must be 'np' or 'pil', got {output_type!r}")
        height, width = self.check_size(height, width)
        if not 0 < strength <= 1:
            raise ValueError(f"strength must be in (0, 1], got {strength}")
        context = None if previous is None else self.image_batch(previous, len(prompts), height, width, "previous")
        start = None if image is None else self.image_batch(image, len(prompts), height, width, "image")
        steps = num_inference_steps or self.config.default_num_inference_steps
        scale = self.config.default_guidance_scale if guidance_scale is None else guidance_scale
        guided = scale > 1

        text = self.encode_prompt(prompts)
        if guided:
            empty = self.encode_prompt([""] * len(prompts))
            text = tuple(torch.cat([u, c]) for u, c in zip(empty, text))
        if context is not None and guided:
            context = torch.cat([context, context])
        shape = (len(prompts), 3, height, width)
        noise = randn_tensor(shape, generator=generator, device=self.device, dtype=self.unet.dtype)
        self.scheduler.set_timesteps(steps, device=self.device)
        timesteps = self.scheduler.timesteps
        if start is None or strength == 1:
            image = noise * self.scheduler.init_noise_sigma
        else:
            skip = steps - max(1, round(steps * strength))
            timesteps = timesteps[skip:]
            self.scheduler.set_begin_index(skip)
            image = self.scheduler.add_noise(start, noise, timesteps[:1])
        for t in self.progress_bar(timesteps):
            model_input = self.scheduler.scale_model_input(torch.cat([image] * 2) if guided else image, t)
            output = self.predict(model_input, t, text, context)
            if guided:
                unconditional, conditional = output.chunk(2)
                output = unconditional + scale * (conditional - unconditional)
            image = self.scheduler.step(output, t, image, generator=generator).prev_sample

        images = (image / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float().cpu().numpy()
        if output_type == "pil":
            images = self.numpy_to_pil(images)
        return ImagePipelineOutput(images=images) if return_dict else (images,)


def build_pixel_pipeline(
    sentences: Iterable[str], config: PixelPipelineConfig | None = None, seed: int = 0
) -> PixelTextToImagePipeline:
    """A randomly initialised pipeline whose tokenizer knows the words of ``sentences``."""
    config = config or PixelPipelineConfig()
    p = config.patch_size
    if any(size % p for size in config.sample_size):
        raise ValueError(f"sample_size {config.sample_size} is not a multiple of patch_size {p}")
    tokenizer = build_word_tokenizer(sentences, model_max_length=config.max_text_length)
    torch.manual_seed(seed)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=config.text_dim,
            intermediate_size=4 * config.text_dim,
            num_hidden_layers=config.text_layers,
            num_attention_heads=config.text_heads,
            max_position_embeddings=config.max_text_length,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            projection_dim=config.text_dim,
        )
    )  # pooler_output is the hidden state at the first [EOS]
    levels = len(config.block_out_channels)
    attention = [i >= levels - config.attention_levels for i in range(levels)]
    cross_only = tuple(i < levels - config.self_attention_levels for i in range(levels))
    unet = UNet2DConditionModel(
        sample_size=tuple(size // p for size in config.sample_size),
        out_channels=3 * p**2,
        in_channels=3 * p**2 * (2 if config.previous_strip else 1) + (3 if config.strip_frames else 0),
        resnet_time_scale_shift="scale_shift" if config.scale_shift else "default",
        block_out_channels=tuple(config.block_out_channels),
        layers_per_block=config.layers_per_block,
        down_block_types=tuple("CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attention),
        up_block_types=tuple("CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attention)),
        # diffusers reads attention_head_dim as the number of heads of each level
        attention_head_dim=tuple(max(1, c // config.head_channels) for c in config.block_out_channels),
        only_cross_attention=cross_only,
        mid_block_only_cross_attention=False,
        cross_attention_dim=config.text_dim,
        norm_num_groups=8,
        class_embed_type="projection",
        projection_class_embeddings_input_dim=config.text_dim,
    )
    return PixelTextToImagePipeline(
        unet=unet,
        scheduler=make_scheduler(config.num_train_timesteps, config.prediction_type, config.solver),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        default_num_inference_steps=config.num_inference_steps,
        default_guidance_scale=config.guidance_scale,
        patch_size=p,
        strip_frames=config.strip_frames,
        previous_strip=config.previous_strip,
    )
