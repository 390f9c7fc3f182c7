"""Datasets: ROCStories (stories, cloze endings, token windows) and the synthetic world (`data.synthetic`)."""
