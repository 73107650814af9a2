"""Test helpers that other projects' tests can reuse: a JupyterLab server that always stops."""

from __future__ import annotations

from fp16lab.testing.lab_server import LabServer, free_port, jupyter_server

__all__ = ["LabServer", "free_port", "jupyter_server"]
