import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors import safe_open

from pipeline.pack.train_renderer import diffusion_loss, main, motion_mask, save_pipeline, to_model_range
from pipeline.rollout import render_states
from renderers.pixel_pipeline import PixelPipelineConfig, PixelTextToImagePipeline, build_pixel_pipeline
from renderers.text_to_image import DiffusersRenderer
from tests.model_factories import one_torch_thread
from world_model.data.synthetic.generator import generate

CLASS_PATH = "renderers.pixel_pipeline:PixelTextToImagePipeline"
SENTENCES = ["the small red ball falls toward the floor.", "the elevator closes its doors on floor two."]
TINY = PixelPipelineConfig(
    patch_size=2,
    strip_frames=3,
    scale_shift=True,
    block_out_channels=(8, 16),
    head_channels=8,
    text_dim=16,
    text_layers=1,
    text_heads=2,
    num_inference_steps=2,
    guidance_scale=2.0,
)
TINY_FLAGS = [
    "--patch-size",
    "2",
    "--strip-frames",
    "3",
    "--scale-shift",
    "--block-out-channels",
    "8",
    "16",
    "--head-channels",
    "8",
    "--text-dim",
    "16",
    "--text-layers",
    "1",
    "--text-heads",
    "2",
    "--num-inference-steps",
    "2",
]


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def pipe():
    return build_pixel_pipeline(SENTENCES, TINY)


@pytest.fixture(scope="module")
def saved(pipe, tmp_path_factory):
    folder = tmp_path_factory.mktemp("renderer") / "pipeline"
    save_pipeline(pipe, folder)
    return folder


def test_saves_float16_and_loads_in_float32_through_the_renderer_by_import_path(saved):
    with safe_open(str(saved / "unet" / "diffusion_pytorch_model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
    assert [p.name for p in saved.parent.iterdir()] == ["pipeline"]  # no temporary folder left behind
    index = json.loads((saved / "model_index.json").read_text())
    assert index["default_num_inference_steps"] == 2 and index["default_guidance_scale"] == 2.0
    renderer = DiffusersRenderer.from_pretrained(saved, pipeline_class=CLASS_PATH)
    assert type(renderer.pipeline) is PixelTextToImagePipeline
    assert renderer.pipeline.unet.dtype == torch.float32 and renderer.pipeline.text_encoder.dtype == torch.float32
    images = renderer(SENTENCES, seed=0)
    assert [(i.shape, i.dtype) for i in images] == [((48, 144, 3), np.uint8)] * 2
    assert not np.array_equal(images[0], images[1])  # the prompt conditions the image
    assert np.array_equal(renderer(SENTENCES[:1], seed=0)[0], images[0])
    assert not np.array_equal(renderer(SENTENCES[:1], seed=1)[0], images[0])


def test_pipeline_class_path_that_does_not_resolve_is_a_clear_error(saved):
    with pytest.raises(ValueError, match="must look like 'package.module:ClassName'"):
        DiffusersRenderer.from_pretrained(saved, pipeline_class="renderers.pixel_pipeline")
    with pytest.raises(ValueError, match="cannot import module 'renderers.no_such_module'"):
        DiffusersRenderer.from_pretrained(saved, pipeline_class="renderers.no_such_module:X")
    with pytest.raises(ValueError, match="has nothing named 'Nope'"):
        DiffusersRenderer.from_pretrained(saved, pipeline_class="renderers.pixel_pipeline:Nope")
    with pytest.raises(ValueError, match="has function named 'build_pixel_pipeline', not a DiffusionPipeline"):
        DiffusersRenderer.from_pretrained(saved, pipeline_class="renderers.pixel_pipeline:build_pixel_pipeline")


def test_sizes_guidance_and_output_types(pipe):
    generator = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    assert pipe(SENTENCES[0], height=24, width=32, generator=generator()).images.shape == (1, 24, 32, 3)
    guided = pipe(SENTENCES[0], generator=generator()).images
    explicit = pipe(SENTENCES[0], num_inference_steps=2, guidance_scale=2.0, generator=generator()).images
    assert np.array_equal(guided, explicit)  # the defaults come from the config
    assert not np.array_equal(guided, pipe(SENTENCES[0], guidance_scale=1.0, generator=generator()).images)
    image = pipe(SENTENCES, output_type="pil").images[1]
    assert image.size == (144, 48) and image.mode == "RGB"
    for size in ({"height": 50}, {"width": 142}, {"height": 0}, {"width": 48.0}):
        with pytest.raises(ValueError, match="must be a positive multiple of 4 .* trained size is 48x144"):
            pipe(SENTENCES[0], **size)
    with pytest.raises(ValueError, match="non-empty list of strings"):
        pipe([])
    with pytest.raises(ValueError, match="output_type must be"):
        pipe(SENTENCES[0], output_type="latent")


def test_the_stochastic_solver_draws_its_noise_from_the_callers_generator(pipe):
    from renderers.pixel_scheduler import set_solver

    assert pipe.scheduler.config.algorithm_type == "sde-dpmsolver++"
    render = lambda seed: pipe(SENTENCES[0], generator=torch.Generator().manual_seed(seed)).images  # noqa: E731
    first = render(0)
    assert np.array_equal(first, render(0)) and not np.array_equal(first, render(1))
    set_solver(pipe, "dpmsolver++")
    try:
        assert pipe.scheduler.config.algorithm_type == "dpmsolver++" and pipe.scheduler.config.thresholding
        assert not np.array_equal(first, render(0))
    finally:
        set_solver(pipe, "sde-dpmsolver++")
    with pytest.raises(ValueError, match=r"solver must be one of sde-dpmsolver\+\+, dpmsolver\+\+, got .euler."):
        set_solver(pipe, "euler")


def test_tokenize_wraps_words_in_bos_eos_and_pads(pipe):
    tokens = pipe.tokenize(["The ball falls.", "", "the zebra falls."])
    tok = pipe.tokenizer
    ids, mask = tokens["input_ids"], tokens["attention_mask"]
    assert ids.shape == (3, tok.model_max_length)
    assert ids[0, :6].tolist() == [
        tok.bos_token_id,
        *tok.convert_tokens_to_ids(["the", "ball", "falls", "."]),
        tok.eos_token_id,
    ]
    assert mask[0].sum() == 6 and (ids[0, 6:] == tok.pad_token_id).all()
    assert ids[1, :3].tolist() == [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id]  # the unconditional input
    assert ids[2, 2] == tok.unk_token_id


def test_coordinate_channels_give_row_column_in_frame_and_frame(pipe):
    row, column, frame = pipe.coordinates(torch.zeros(2, 12, 4, 12))[1]  # a strip of 3 frames, 4 columns each
    assert torch.equal(row[:, 0], torch.linspace(-1, 1, 4)) and (row == row[:, :1]).all()
    assert frame[0].tolist() == [-1.0] * 4 + [0.0] * 4 + [1.0] * 4 and (frame == frame[:1]).all()
    assert torch.allclose(column[0], torch.tensor([-0.75, -0.25, 0.25, 0.75]).repeat(3))
    assert pipe.unet.config.in_channels == 3 * 2**2 + 3 and pipe.unet.config.out_channels == 3 * 2**2


def test_loss_falls_when_fitting_one_batch():
    pipe = build_pixel_pipeline(SENTENCES, TINY)
    strips = np.full((2, 48, 144, 3), 235, np.uint8)
    strips[0, :, :40], strips[1, 20:] = (220, 40, 40), (40, 80, 220)
    images = to_model_range(strips)
    parameters = [*pipe.unet.parameters(), *pipe.text_encoder.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=5e-3)
    losses = []
    for _ in range(12):
        loss = diffusion_loss(pipe, images, SENTENCES, torch.Generator().manual_seed(0))  # same noise each time
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert pipe.text_encoder.get_input_embeddings().weight.grad.abs().sum() > 0  # trained jointly


def test_motion_mask_marks_where_an_object_moves_in_every_frame_of_the_strip():
    strips = np.full((2, 12, 36, 3), 235, np.uint8)  # 3 frames of 12 x 12
    strips[:, 9:11, 30:36] = 60  # a floor drawn in the last frame only: changes between frames
    for frame, column in enumerate((2, 5, 8)):  # strip 0: a dot moving right
        strips[0, 4, 12 * frame + column] = (220, 40, 40)
    strips[1, 4, [2, 14, 26]] = (220, 40, 40)  # strip 1: a dot at rest
    mask = motion_mask(to_model_range(strips))
    assert mask.shape == (2, 1, 12, 36)
    frames = mask.view(2, 12, 3, 12)
    assert torch.equal(frames[:, :, 0], frames[:, :, 2])  # the same mask in every frame
    moving = frames[0, :, 0]
    assert moving[3:6, [1, 2, 3, 4, 5, 6, 7, 8, 9]].all()  # the dot's three places, grown by a pixel
    assert moving[:2].sum() == 0 and moving[4, 11] == 0
    assert frames[1, 4, 0, 2] == 0 and frames[1, :8].sum() == 0  # a dot at rest is not motion
    assert frames[1, 9:11, 0, 6:].all()
    with pytest.raises(ValueError, match="multiple of 3"):
        motion_mask(torch.zeros(1, 3, 12, 35))


def test_motion_weight_raises_the_loss_only_where_the_strip_moves():
    pipe = build_pixel_pipeline(SENTENCES, TINY)
    still = np.full((2, 48, 144, 3), 235, np.uint8)
    moving = still.copy()
    moving[:, 20:28, 4:12], moving[:, 20:28, 60:68] = (220, 40, 40), (220, 40, 40)

    def loss(strips, weight):
        with torch.no_grad():
            return diffusion_loss(
                pipe, to_model_range(strips), SENTENCES, torch.Generator().manual_seed(0), motion_weight=weight
            ).item()

    assert loss(still, 4.0) == pytest.approx(loss(still, 0.0))
    assert loss(moving, 4.0) > 1.05 * loss(moving, 0.0)


def test_training_command_refuses_an_unknown_solver_before_reading_data(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"), "--solver", "euler"]) == 2
    assert capsys.readouterr().err.startswith("error: --solver must be one of sde-dpmsolver")
    assert not (tmp_path / "run").exists()


def test_training_command_saves_a_loadable_pipeline(tmp_path):
    generate(2, seed=0, out_dir=tmp_path / "world", size=48, seconds=2)
    generate(1, seed=0, out_dir=tmp_path / "world", split="heldout", size=48, seconds=2)
    out = tmp_path / "run"
    main(
        [
            "--data",
            str(tmp_path / "world"),
            "--out",
            str(out),
            "--max-steps",
            "6",
            "--batch-size",
            "2",
            "--warmup-steps",
            "2",
            "--log-every",
            "2",
            "--motion-weight",
            "2",
            *TINY_FLAGS,
        ]
    )
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps"] == 6 and log["strips"] > 0 and len(log["loss"]) == 3
    assert all(np.isfinite(entry["loss"]) for entry in log["loss"])
    assert (out / "samples" / "step_000006.png").is_file()
    renderer = DiffusersRenderer.from_pretrained(out / "pipeline", pipeline_class=CLASS_PATH)
    assert renderer.pipeline.config.default_num_inference_steps == 2 and renderer.pipeline.config.strip_frames == 3
    assert renderer.pipeline.unet.config.resnet_time_scale_shift == "scale_shift"
    assert renderer(["the small red ball falls toward the floor."])[0].shape == (48, 144, 3)


TRAIN_FLAGS = ["--batch-size", "2", "--warmup-steps", "2", "--log-every", "1", "--max-minutes", "100000", *TINY_FLAGS]


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    world = tmp_path_factory.mktemp("world")
    generate(2, seed=0, out_dir=world, size=48, seconds=2)
    generate(1, seed=0, out_dir=world, split="heldout", size=48, seconds=2)
    return world


def unet_weights(run):
    with safe_open(run / "pipeline" / "unet" / "diffusion_pytorch_model.safetensors", "pt") as f:
        return {k: f.get_tensor(k).float() for k in f.keys()}


def test_a_stopped_run_resumed_ends_where_an_unbroken_one_does(tmp_path, tiny_world):
    unbroken, stopped = tmp_path / "unbroken", tmp_path / "stopped"
    main(["--data", str(tiny_world), "--out", str(unbroken), "--max-steps", "6", *TRAIN_FLAGS])
    main(["--data", str(tiny_world), "--out", str(stopped), "--max-steps", "3", *TRAIN_FLAGS])
    assert json.loads((stopped / "train_log.json").read_text())["steps"] == 3
    main(["--data", str(tiny_world), "--out", str(stopped), "--max-steps", "6", "--resume", *TRAIN_FLAGS])
    log = json.loads((stopped / "train_log.json").read_text())
    assert log["steps"] == 6 and [e["step"] for e in log["loss"]] == [1, 2, 3, 4, 5, 6]
    a, b = unet_weights(unbroken), unet_weights(stopped)
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], atol=2e-3) for k in a)  # the moving averages, saved in float16
    first = json.loads((unbroken / "train_log.json").read_text())["loss"]
    assert [e["loss"] for e in log["loss"]] == pytest.approx([e["loss"] for e in first], rel=1e-3)


def test_resume_refuses_changed_settings_and_a_folder_without_a_state(tmp_path, tiny_world, capsys):
    run = tmp_path / "run"
    assert main(["--data", str(tiny_world), "--out", str(run), "--resume", *TRAIN_FLAGS]) == 2
    assert "holds no resume state" in capsys.readouterr().err
    main(["--data", str(tiny_world), "--out", str(run), "--max-steps", "2", *TRAIN_FLAGS])
    before = unet_weights(run)
    code = main(["--data", str(tiny_world), "--out", str(run), "--resume", "--max-steps", "4", *TRAIN_FLAGS,
                 "--lr", "0.5"])  # fmt: skip
    assert code != 0 and "--lr differ from the run" in capsys.readouterr().err
    assert all(torch.equal(before[k], w) for k, w in unet_weights(run).items())  # nothing overwritten


def test_frame_size_sets_the_strips_the_renderer_trains_on_and_draws(tmp_path, tiny_world):
    out = tmp_path / "run"
    main(["--data", str(tiny_world), "--out", str(out), "--max-steps", "1", "--frame-size", "32", *TRAIN_FLAGS])
    renderer = DiffusersRenderer.from_pretrained(out / "pipeline", pipeline_class=CLASS_PATH)
    assert renderer(["the small red ball falls toward the floor."])[0].shape == (32, 96, 3)
    assert PixelPipelineConfig(frame_size=96).sample_size == (96, 288)


def test_a_previous_strip_pipeline_reads_the_strip_it_continues():
    pipe = build_pixel_pipeline(SENTENCES, replace(TINY, previous_strip=True))
    assert pipe.unet.config.in_channels == 2 * 3 * 2**2 + 3
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 256, (48, 144, 3), dtype=np.uint8) for _ in range(2))
    zeros = np.full((48, 144, 3), 127.5)  # 0 in the model's range

    def render(previous):
        return pipe(SENTENCES[:1], generator=torch.Generator().manual_seed(0), previous=previous).images[0]

    assert not np.allclose(render([a]), render([b]))
    assert np.allclose(render(None), render([zeros]), atol=1e-2)
    with pytest.raises(ValueError, match="2 previous images for 1 prompts"):
        render([a, b])


def test_starting_from_an_image_runs_that_fraction_of_the_steps_from_it_noised(pipe, monkeypatch):
    init = np.random.default_rng(1).integers(0, 256, (48, 144, 3), dtype=np.uint8)
    target = torch.from_numpy(init).permute(2, 0, 1).float().div(127.5).sub(1).flatten()
    calls = []

    def record(sample, t, text, previous=None):
        calls.append((sample[0].flatten().clone(), int(t)))
        return torch.zeros_like(sample)

    monkeypatch.setattr(pipe, "predict", record)

    def first_input(strength):
        calls.clear()
        pipe(SENTENCES[:1], num_inference_steps=10, guidance_scale=1.0, generator=torch.Generator().manual_seed(0),
             image=[init], strength=strength)  # fmt: skip
        return len(calls), float(torch.corrcoef(torch.stack([calls[0][0], target]))[0, 1]), calls[0][1]

    steps, likeness, t = first_input(0.3)
    assert steps == 3 and t == int(pipe.scheduler.timesteps[7])
    signal = pipe.scheduler.alphas_cumprod[t] * target.var()  # x_t = a x + s e: its correlation with x
    assert likeness == pytest.approx(float((signal / (signal + 1 - pipe.scheduler.alphas_cumprod[t])).sqrt()), abs=0.03)
    steps, likeness, _ = first_input(1.0)
    assert steps == 10 and abs(likeness) < 0.1  # pure noise
    with pytest.raises(ValueError, match="strength must be in"):
        first_input(0.0)


def test_training_with_previous_strips_saves_a_pipeline_that_reads_them(tmp_path, tiny_world):
    out = tmp_path / "run"
    main(["--data", str(tiny_world), "--out", str(out), "--max-steps", "2", "--previous-strip", *TRAIN_FLAGS])
    renderer = DiffusersRenderer.from_pretrained(out / "pipeline", pipeline_class=CLASS_PATH)
    assert renderer.pipeline.config.previous_strip
    previous = np.zeros((48, 144, 3), dtype=np.uint8)
    assert renderer.pipeline(SENTENCES[:1], previous=[previous]).images[0].shape == (48, 144, 3)


def test_the_renderer_passes_a_continuing_pipeline_the_image_before_and_the_loop_chains_them(tmp_path):
    folder = tmp_path / "pipeline"
    save_pipeline(build_pixel_pipeline(SENTENCES, replace(TINY, previous_strip=True)), folder)
    renderer = DiffusersRenderer.from_pretrained(folder, pipeline_class=CLASS_PATH)
    assert renderer.continues
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 256, (48, 144, 3), dtype=np.uint8) for _ in range(2))
    from_a = renderer(SENTENCES[:1], seed=3, init_images=[a])[0]
    assert not np.array_equal(from_a, renderer(SENTENCES[:1], seed=3, init_images=[b])[0])
    direct = renderer.pipeline(SENTENCES[:1], generator=torch.Generator().manual_seed(3), previous=[a]).images[0]
    assert np.array_equal(from_a, (direct * 255).round().astype(np.uint8))

    seen = []

    def continuing(prompts, seed=0, init_images=None):
        seen.append(None if init_images is None else int(init_images[0][0, 0, 0]))
        return [np.full((4, 4, 3), len(seen), dtype=np.uint8)]

    continuing.continues = True
    render_states(continuing, [["x", "y", "z"]], 0, np.full((4, 4, 3), 99, dtype=np.uint8), lambda *a: None)
    assert seen == [99, 1, 2]  # the last observed image, then each render the one before
