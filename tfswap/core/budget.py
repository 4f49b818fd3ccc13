"""Memory budgets as users write them: bytes, "12GiB", "800 MB", or a fraction of the device.

Example::

    parse_budget("12GiB")                       # 12884901888
    parse_budget(0.5, device_memory_bytes=16 * 2**30)   # 8589934592
    parse_budget(3_000_000_000)                 # 3000000000
"""

from __future__ import annotations

import math
import re

UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


class BudgetError(ValueError):
    """A memory budget that cannot be used; the message says what to pass instead."""


def parse_budget(budget, device_memory_bytes: int | None = None) -> int:
    """Bytes of a memory budget.

    ``budget``: an int (bytes); a float in (0, 1] (a fraction of
    ``device_memory_bytes``); or a string with a unit (B, kB, MB, GB, TB,
    KiB, MiB, GiB, TiB; case-insensitive; "12GiB", "800 MB").  A budget
    above ``device_memory_bytes`` (when given) is refused: the plan could
    not run on that device.
    """
    if isinstance(budget, bool) or budget is None:
        raise BudgetError(f"memory_budget must be bytes, a string such as '12GiB', or a "
                          f"fraction of the device's memory such as 0.5; got {budget!r}")
    if isinstance(budget, str):
        match = _PATTERN.match(budget)
        unit = match.group(2).lower() if match else ""
        if not match or (unit and unit not in UNITS):
            raise BudgetError(f"cannot read memory_budget {budget!r}; write a number with a "
                              "unit, e.g. '12GiB', '800MB' or '2.5 GB' (units: "
                              f"{', '.join(sorted(UNITS, key=UNITS.get))})")
        if not unit:
            raise BudgetError(f"memory_budget {budget!r} has no unit; write e.g. "
                              f"'{budget.strip()}GiB' or pass an int of bytes")
        nbytes = float(match.group(1)) * UNITS[unit]
    elif isinstance(budget, float):
        if not math.isfinite(budget) or budget <= 0:
            raise BudgetError(f"memory_budget must be > 0, got {budget!r}")
        if budget > 1:
            raise BudgetError(f"a float memory_budget is a fraction of the device's memory "
                              f"and must be in (0, 1], got {budget!r}; pass an int for bytes "
                              "or a string such as '12GiB'")
        if device_memory_bytes is None:
            raise BudgetError(f"memory_budget {budget!r} is a fraction of the device's memory, "
                              "but the device's memory is unknown; pass device_spec or a budget "
                              "in bytes")
        nbytes = budget * device_memory_bytes
    elif isinstance(budget, int):
        nbytes = budget
    else:
        raise BudgetError(f"memory_budget must be an int (bytes), a string such as '12GiB' or "
                          f"a float fraction of the device's memory; got {type(budget).__name__}")
    nbytes = int(nbytes)
    if nbytes <= 0:
        raise BudgetError(f"memory_budget must be > 0 bytes, got {budget!r}")
    if device_memory_bytes is not None and nbytes > device_memory_bytes:
        raise BudgetError(f"memory_budget {budget!r} ({nbytes} bytes) is more than the device "
                          f"has ({device_memory_bytes} bytes); pass at most that, or a fraction "
                          "such as 0.9")
    return nbytes
