"""Renderers: text-to-image models and writers for videos and storyboards."""
