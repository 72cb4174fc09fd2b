"""What the framework tests share: the dataset's shape and the sample-to-index transform."""

from __future__ import annotations

from pathlib import Path

COUNTS = [16] * 6  # 96 samples: 48 per rank, 6 batches of 8
BATCH = 8
PHASE1_STEPS = 2
ROOT = Path(__file__).resolve().parents[2]


def to_idx(sample: dict) -> dict:
    return {"idx": int(sample["cls"])}
