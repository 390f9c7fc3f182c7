"""Building the offline pack from the synthetic world: training its captioner and renderer, the grounding reference,
and the world-level evaluation (caption, predict, render round trips)."""
