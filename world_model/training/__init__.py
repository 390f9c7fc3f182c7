"""Training a predictor (`python -m world_model.training.train`): config files, the loop, the schedule, export."""
