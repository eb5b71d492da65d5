"""The caps on what one ``dpsql serve`` connection holds in its worker: :class:`StateCaps`.

Prepared statements, portals and the names and values given by SET stay in the connection's
worker until the client frees them (Close, DEALLOCATE, RESET). Without a cap one client grew a
worker without bound (3,000 prepared statements: 155 to 415 MB), so each is counted here and a
message past its cap is refused with SQLSTATE 53400 (``ConnectionLimitExceeded``), nothing
else changing. The caps are ``Limits.max_prepared``, ``max_portals``, ``max_state_bytes``,
``max_settings`` and ``max_setting_value`` (docs/server.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dpsql.interfaces.pgwire.config import Limits
from dpsql.interfaces.pgwire.statements import RESET, SET_VALUE, ConnectionLimitExceeded

__all__ = ["StateCaps"]


@dataclass
class StateCaps:
    """The bytes held per prepared statement ("S", name) and portal ("P", name), and the names
    SET, of one connection, under ``limits``."""

    limits: Limits = field(default_factory=Limits)
    held: dict[tuple[str, str], int] = field(default_factory=dict)
    set_names: set[str] = field(default_factory=set)

    def hold(self, which: str, name: str, size: int) -> None:
        """Count a new prepared statement ("S") or portal ("P") of ``size`` bytes, or refuse it
        past its cap (an unnamed one replaces the last, and a name given again its own)."""
        cap = self.limits.max_prepared if which == "S" else self.limits.max_portals
        kind = "prepared statements" if which == "S" else "portals"
        count = sum(1 for w, n in self.held if w == which and n)
        if name and (which, name) not in self.held and count >= cap:
            raise ConnectionLimitExceeded(
                f"too many {kind} on this connection (at most {cap}); close or DEALLOCATE some"
            )
        held = sum(self.held.values()) - self.held.get((which, name), 0) + size
        if held > self.limits.max_state_bytes:
            raise ConnectionLimitExceeded(
                "the prepared statements and portals of this connection would hold more than "
                f"{self.limits.max_state_bytes} bytes; close or DEALLOCATE some"
            )
        self.held[which, name] = size

    def free(self, which: str, name: str | None = None) -> None:
        """Free one prepared statement or portal, or (``name`` None) every one of ``which``."""
        if name is None:
            self.held = {k: v for k, v in self.held.items() if k[0] != which}
        else:
            self.held.pop((which, name), None)

    def count_setting(self, text: str) -> None:
        """Hold the SET names and values of one connection under their caps (53400)."""
        reset = RESET.match(text)
        if reset:
            name = reset.group(1).lower()
            if name == "all":
                self.set_names.clear()
            else:
                self.set_names.discard(name)
            return
        assigned = SET_VALUE.match(text)
        if assigned is None:
            return
        name, value = assigned.group(1).lower(), assigned.group(2).strip().rstrip(";").strip()
        if len(value) > self.limits.max_setting_value:
            raise ConnectionLimitExceeded(
                f"the value SET for {name} is longer than {self.limits.max_setting_value} "
                "characters"
            )
        if name not in self.set_names and len(self.set_names) >= self.limits.max_settings:
            raise ConnectionLimitExceeded(
                f"too many settings SET on this connection (at most {self.limits.max_settings})"
            )
        self.set_names.add(name)
