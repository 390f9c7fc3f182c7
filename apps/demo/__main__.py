"""`python -m apps.demo`: serve the demo (`apps.demo.app.main`)."""

from apps.demo.app import main

if __name__ == "__main__":
    raise SystemExit(main())
