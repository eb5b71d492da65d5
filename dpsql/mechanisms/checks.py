"""Argument checks shared by the mechanisms' mathematics and the samplers.

An integer is an int (a numpy integer is taken as one, a bool never), a count is at least its
minimum, and a confidence lies strictly between 0 and 1.
"""

from __future__ import annotations

import math

import numpy as np

from dpsql.errors import ParameterError


def check_int(value: object, name: str) -> int:
    if isinstance(value, np.integer):  # sizes often come out of numpy arithmetic
        return int(value)
    # bool is an int subclass; True as a size or a count is always a bug at the call site.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParameterError(f"{name} must be an int, not {type(value).__name__}")
    return value


def check_count(value: object, name: str, minimum: int) -> int:
    value = check_int(value, name)
    if value < minimum:
        raise ParameterError(f"{name} must be at least {minimum}")
    return value


def check_confidence(confidence: object) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise ParameterError("the confidence must be a float")
    if not (math.isfinite(confidence) and 0 < confidence < 1):
        raise ParameterError("the confidence must be strictly between 0 and 1")
    return float(confidence)
