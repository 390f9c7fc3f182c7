"""Test-wide settings: no test reaches a model hub (none is reachable here, and a retry loop costs minutes)."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
