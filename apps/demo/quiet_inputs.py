"""The page's inputs, refusing a value the page itself never sends (an API call with an out-of-range slider or an
unknown preset) with one log line and a message for the caller, instead of Gradio's traceback in the server log.

Each is a Gradio template of the component it extends (`is_template`: its first base names the component the page
draws).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import gradio as gr

logger = logging.getLogger("apps.demo")


def quietly(component: gr.components.Component, preprocess: Callable[[Any], Any], payload: Any) -> Any:
    """`preprocess(payload)`; a value it refuses (gr.Error) is logged in one line and refused without a traceback."""
    try:
        return preprocess(payload)
    except gr.Error as err:
        logger.warning("refused a request: %s: %s", component.label or type(component).__name__, err.message)
        raise gr.Error(err.message, print_exception=False) from None


class Slider(gr.Slider):
    is_template = True

    def preprocess(self, payload):
        return quietly(self, super().preprocess, payload)


class Dropdown(gr.Dropdown):
    is_template = True

    def preprocess(self, payload):
        return quietly(self, super().preprocess, payload)


class Number(gr.Number):
    is_template = True

    def preprocess(self, payload):
        return quietly(self, super().preprocess, payload)
