"""Small shared pieces with no science in them: atomic file writes, video writing, model-loading errors."""
