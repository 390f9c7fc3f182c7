"""Gradio demo of the video rollout: upload a clip, see its captions, the predicted sentences and their frames.

    python -m apps.demo [--port 7860] [--host 127.0.0.1] [--preset auto|hub|offline]
                        [--captioner X --renderer Y --predictor Z] [--device D] [--concurrency 1]
                        [--max-file-mb 200] [--max-minutes 10]

`apps.demo.app.build_demo(config)` returns the `gr.Blocks` app (tests build it with tiny local models) and
`launch_demo(demo, config)` serves it with the upload limit; `DemoConfig` (`apps.demo.config`) holds every setting.
Every request runs `run_rollout` in its own folder under a temporary root (`apps.demo.run`), so two people never
see each other's files; the folder is offered as a zip. Rollouts go through Gradio's queue, `concurrency` at a
time (default 1). Requests are checked before any model work (`apps.demo.checks`).
"""
