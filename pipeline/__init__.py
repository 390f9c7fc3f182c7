"""Orchestration of the video rollout: frames -> sentences -> predicted sentences -> frames."""
