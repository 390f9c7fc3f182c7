"""Visual encoders: frame sampling and image-to-text captioners."""
