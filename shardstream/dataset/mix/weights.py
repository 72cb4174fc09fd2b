"""A mix's weights: checked per source, and the per-label rules of class-balanced sampling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import UsageError
from .batches import source_name


def source_weights(sources: Sequence[Any], weights: Sequence[float] | None) -> np.ndarray:
    """Normalised weights, one per source (default: the sources' sizes); a one-line error naming the
    source whose weight is negative or not a number."""
    sizes = np.array([s.num_samples for s in sources], dtype=np.float64)
    if weights is None:
        return sizes / sizes.sum()
    if isinstance(weights, dict) or len(weights) != len(sources):
        found = len(weights) if hasattr(weights, "__len__") else type(weights).__name__
        raise UsageError(
            f"MixedDataset got {found} weights for {len(sources)} sources; give one weight per source"
        )
    w = np.asarray([float(x) for x in weights], dtype=np.float64)
    for i, x in enumerate(w):
        if not np.isfinite(x) or x < 0:
            raise UsageError(
                f"weight {weights[i]!r} of source {i} ({source_name(sources[i])}) is not a number of 0 or "
                "more; weights are relative, e.g. [0.7, 0.2, 0.1]"
            )
    if w.sum() <= 0:
        raise UsageError(
            "every weight of the mix is 0: at least one source needs a positive weight"
        )
    return w / w.sum()


def label_weights(
    names: Sequence[Any], sources: Sequence[Any], weights: str | Mapping[Any, float] | None
) -> Any:
    """Per-label weights from a rule: ``"balanced"`` (equal), ``"sqrt"`` (square root of each label's
    size), ``None`` (the sizes) or a mapping that names every label."""
    sizes = np.array([s.num_samples for s in sources], dtype=np.float64)
    if weights == "balanced":
        return np.ones(len(sources))
    if weights == "sqrt":
        return np.sqrt(sizes)
    if weights is None:
        return None
    if isinstance(weights, Mapping):
        unknown = [k for k in weights if k not in names]
        missing = [k for k in names if k not in weights]
        if unknown or missing:
            what = (
                f"name label {unknown[0]!r} that the dataset lacks"
                if unknown
                else f"lack label {missing[0]!r}"
            )
            raise UsageError(
                f"the weights {what}; give a weight for every label of {sorted(map(str, names))} "
                "(0 leaves one out)"
            )
        return [weights[k] for k in names]
    raise UsageError(
        f"weights must be 'balanced', 'sqrt', None or a {{label: weight}} mapping, not {weights!r}"
    )


__all__ = ["label_weights", "source_weights"]
