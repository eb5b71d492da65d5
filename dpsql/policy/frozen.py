"""The base of the policy's pydantic models: frozen, and no field beyond those declared."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Frozen"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)
