"""Skipping a test file that needs an optional framework without importing the framework at
collection: every pytest worker collects every file, so a module-level
``pytest.importorskip("keras")`` costs each worker Keras's and TensorFlow's import (about 5
s) whether or not it runs that file. ``needs("keras")`` reads only whether it is installed
(``importlib.util.find_spec``); the tests import it where they use it."""

from __future__ import annotations

import importlib.util

import pytest


def installed(name: str) -> bool:
    """Whether the (top-level) module ``name`` is installed, without importing it."""
    return importlib.util.find_spec(name) is not None


def needs(name: str) -> pytest.MarkDecorator:
    """A ``skipif`` mark: skip unless ``name`` is installed."""
    return pytest.mark.skipif(not installed(name), reason=f"{name} is not installed")
