"""The offline pack renderer's samplers: DPM-Solver++ on the cosine schedule, stochastic or not, chosen by name."""

from __future__ import annotations

from diffusers import DiffusionPipeline, DPMSolverMultistepScheduler

SOLVERS = ("sde-dpmsolver++", "dpmsolver++")  # DPM-Solver++ (2M) with fresh noise at each step, or the ODE one


def check_solver(solver: str) -> str:
    """``solver`` itself if it is one of ``SOLVERS``, else a ``ValueError`` that lists them."""
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    return solver


def make_scheduler(
    num_train_timesteps: int = 1000, prediction_type: str = "sample", solver: str = "sde-dpmsolver++"
) -> DPMSolverMultistepScheduler:
    """DPM-Solver++ (2M, ``solver`` one of ``SOLVERS``) on the cosine schedule, sampling from pure noise
    ("trailing" timesteps) and clipping the predicted clean image to [-1, 1] (dynamic thresholding)."""
    return DPMSolverMultistepScheduler(
        num_train_timesteps=num_train_timesteps,
        beta_schedule="squaredcos_cap_v2",
        prediction_type=prediction_type,
        timestep_spacing="trailing",
        thresholding=True,
        dynamic_thresholding_ratio=0.995,
        sample_max_value=1.0,
        final_sigmas_type="zero",
        algorithm_type=check_solver(solver),
    )


def set_solver(pipe: DiffusionPipeline, solver: str) -> None:
    """Switch ``pipe``'s DPM-Solver++ scheduler to ``solver`` (one of ``SOLVERS``), keeping its other settings."""
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config, algorithm_type=check_solver(solver))
