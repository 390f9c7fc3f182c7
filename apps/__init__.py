"""User-facing applications (the Gradio demo)."""
