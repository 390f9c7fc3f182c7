"""The page's inputs refuse a value the page itself never sends (an API call with an out-of-range slider or an unknown
preset) with one log line and a message for the caller, instead of Gradio's traceback in the server log.

`quiet(component)` wraps that one component's `preprocess` (no subclass: Gradio writes a stub file beside the module of
every component class).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

import gradio as gr

logger = logging.getLogger("apps.demo")
Component = TypeVar("Component", bound=gr.components.Component)


def quiet(component: Component) -> Component:
    """`component`, its refusals (gr.Error from its `preprocess`) logged in one line and raised without a traceback."""
    component.preprocess = refusing_quietly(component, component.preprocess)
    return component


def refusing_quietly(component: gr.components.Component, preprocess: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def checked(payload: Any) -> Any:
        try:
            return preprocess(payload)
        except gr.Error as err:
            logger.warning("refused a request: %s: %s", component.label or type(component).__name__, err.message)
            raise gr.Error(err.message, print_exception=False) from None

    return checked
