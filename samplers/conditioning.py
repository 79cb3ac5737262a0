"""Row operations on opaque conditioning.

Samplers never look inside the conditioning a velocity function takes; they
only need to select rows of it (tree nodes follow their prompt) and to stack
two of them (the CFG batch). Conditioning is a tensor, or a tuple, list or
dict nesting tensors; every tensor's first dimension is the batch. Anything
that is not a tensor (``None``, a number, a string) is shared by all rows and
passed through unchanged.
"""

from __future__ import annotations

from typing import Any

import torch


def select_rows(cond: Any, index: torch.Tensor) -> Any:
    """``cond`` with every tensor indexed by ``index`` along its first dimension."""
    if isinstance(cond, torch.Tensor):
        return cond[index.to(cond.device)]
    if isinstance(cond, dict):
        return {key: select_rows(value, index) for key, value in cond.items()}
    if isinstance(cond, (tuple, list)):
        return type(cond)(select_rows(value, index) for value in cond)
    return cond


def concat_rows(first: Any, second: Any) -> Any:
    """Row-wise concatenation of two conditionings of the same structure."""
    if isinstance(first, torch.Tensor):
        return torch.cat([first, second.to(first.device)])
    if isinstance(first, dict):
        if first.keys() != second.keys():
            raise ValueError(f"cannot stack conditionings with keys {sorted(first)} and {sorted(second)}")
        return {key: concat_rows(first[key], second[key]) for key in first}
    if isinstance(first, (tuple, list)):
        if len(first) != len(second):
            raise ValueError(f"cannot stack conditionings of lengths {len(first)} and {len(second)}")
        return type(first)(concat_rows(a, b) for a, b in zip(first, second))
    return first


def num_rows(cond: Any) -> int | None:
    """The batch size of ``cond`` (first dimension of its first tensor), or None when it holds no tensor."""
    if isinstance(cond, torch.Tensor):
        return cond.shape[0]
    values = cond.values() if isinstance(cond, dict) else cond if isinstance(cond, (tuple, list)) else ()
    for value in values:
        rows = num_rows(value)
        if rows is not None:
            return rows
    return None


def broadcast_rows(cond: Any, rows: int) -> Any:
    """``cond`` with ``rows`` rows: unchanged when it has them, its one row repeated when it has one."""
    have = num_rows(cond)
    if have is None or have == rows:
        return cond
    if have == 1:
        return select_rows(cond, torch.zeros(rows, dtype=torch.long))
    raise ValueError(f"conditioning has {have} rows; expected {rows} or 1 (shared by every row)")
