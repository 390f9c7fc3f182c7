"""The semantic world model: the 4-tensor predictor, its vocabulary and ROCStories data."""
