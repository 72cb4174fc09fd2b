"""The loader/dataset contract: every dataset kind is a ``Readable``, and a new kind written as the layout
page (docs/design/layout.md) shows (a ``PlannedDataset`` subclass that says how a pass reads) gets the loader's guarantees: every sample
once per epoch, equal batches per rank, resume mid-epoch with other workers."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from shardstream.dataset import MixedDataset, PlannedDataset, Readable, ShardDataset, TokenDataset
from tests.sample_datasets import write_dataset
from tests.token_corpus import pack_positions

LAYOUT = Path(__file__).resolve().parents[2] / "docs" / "design" / "layout.md"


@pytest.fixture(scope="module")
def squares():
    """The layout page's example dataset kind, run from the page itself."""
    text = LAYOUT.read_text()
    code = re.search(r"runs this example\):\n\n```python\n(.*?)```", text, re.S).group(1)
    space: dict = {}
    exec(compile(code.split("\nloader = ")[0], "layout example", "exec"), space)  # our docs
    return space["Squares"]


def test_every_dataset_kind_is_readable(tmp_path, squares):
    url = write_dataset(tmp_path, [3, 4])
    tokens, _ = pack_positions(tmp_path, [20, 30], shard_size="64B", name="tok")
    kinds = [
        ShardDataset(url),
        TokenDataset(tokens, 4),
        MixedDataset([ShardDataset(url)]),
        squares(10),
    ]
    for ds in kinds:
        assert isinstance(ds, Readable) and isinstance(ds, PlannedDataset)
    # siblings: none pretends to be another
    assert not isinstance(TokenDataset(tokens, 4), ShardDataset)


def test_a_new_kind_gets_the_plan_s_guarantees(squares):
    whole = sorted(i * i for i in range(100))
    got = torch.cat([b["x"] for b in squares(100).loader(batch_size=10, num_workers=2)]).tolist()
    assert sorted(got) == whole
    assert sorted(torch.cat([b["x"] for b in squares(100).loader(10, 0)]).tolist()) == whole
    first = squares(100).loader(batch_size=10, num_workers=0)
    it = iter(first)
    head = [next(it)["x"] for _ in range(3)]
    later = squares(100).loader(batch_size=10, num_workers=2)
    later.load_state_dict(first.state_dict())
    rest = [b["x"] for b in later]
    assert sorted(torch.cat(head + rest).tolist()) == whole and len(rest) == 7


def test_a_new_kind_splits_equally_over_ranks(squares, monkeypatch):
    parts = []
    monkeypatch.setenv("WORLD_SIZE", "3")
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        ds = squares(100)
        parts.append(
            np.concatenate([b["x"].numpy() for b in ds.loader(batch_size=7, num_workers=0)])
        )
    assert len({len(p) for p in parts}) == 1 and len(parts[0]) == 34  # 100 / 3, padded
    assert set(np.concatenate(parts).tolist()) == {i * i for i in range(100)}
