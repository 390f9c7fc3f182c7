"""Predicting sentences with a trained predictor: the `predict` command and the sentence-bank readout."""
