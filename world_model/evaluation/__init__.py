"""Scoring a predictor: L_S(4) and token accuracy, count floors, Story Cloze, seed statistics, readout quality."""
