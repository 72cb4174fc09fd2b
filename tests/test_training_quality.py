"""Shuffle quality in real training (issue 11): a small model on scikit-learn's digits, packed from a
class-sorted ImageFolder tree into shards of 200, trains as well through ShardDataset as through an
in-memory ``DataLoader(shuffle=True)``."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from shardstream import ShardDataset, pack

sklearn = pytest.importorskip("sklearn")
Image = pytest.importorskip("PIL.Image")

SEEDS = (0, 1, 2, 3, 4)
EPOCHS = 10
BATCH = 32


def digits_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    return train_test_split(x, digits.target, test_size=450, random_state=0, stratify=digits.target)


def image_folder(root, x, y):
    """root/<class>/<n>.png, as ImageFolder trees are: listing it gives the samples sorted by class."""
    for n, (img, label) in enumerate(zip(x, y)):
        folder = root / f"{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((img * 16).astype(np.uint8)).save(folder / f"{n:04d}.png")
    return root


def decode(sample):
    img = np.asarray(Image.open(io.BytesIO(sample["png"])), dtype=np.float32) / 16.0
    return img.reshape(-1), int(sample["cls"])


def train(batches_per_epoch, seed: int, x_test, y_test) -> float:
    """Accuracy on the test split of a softmax regression trained by SGD on the given batches."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for epoch in range(EPOCHS):
        for xb, yb in batches_per_epoch(epoch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    with torch.no_grad():
        pred = model(torch.from_numpy(x_test.reshape(len(x_test), -1))).argmax(1).numpy()
    return float((pred == y_test).mean() * 100)


def in_memory(x, y, seed):
    data = torch.utils.data.TensorDataset(
        torch.from_numpy(x.reshape(len(x), -1)), torch.from_numpy(y)
    )
    loader = torch.utils.data.DataLoader(
        data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    return lambda epoch: loader


def through_shards(url, seed, **kw):
    ds = ShardDataset(url, seed=seed, decode=None, transform=decode, **kw)

    def epoch_batches(epoch):
        ds.set_epoch(epoch)
        samples = list(ds)
        for i in range(0, len(samples), BATCH):
            chunk = samples[i : i + BATCH]
            yield (
                torch.from_numpy(np.stack([s[0] for s in chunk])),
                torch.tensor([s[1] for s in chunk]),
            )

    return epoch_batches


def mean_accuracy(make, x_test, y_test) -> float:
    return float(np.mean([train(make(seed), seed, x_test, y_test) for seed in SEEDS]))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    x_train, x_test, y_train, y_test = digits_split()
    assert len(x_train) == 1347
    root = image_folder(tmp_path_factory.mktemp("digits") / "train", x_train, y_train)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add overhead
    try:
        reference = mean_accuracy(lambda s: in_memory(x_train, y_train, s), x_test, y_test)
        yield root, reference, x_test, y_test
    finally:
        torch.set_num_threads(threads)


def test_a_class_sorted_pack_trains_as_well_as_an_in_memory_shuffle(digits, tmp_path):
    root, reference, x_test, y_test = digits
    url = tmp_path / "shards"
    result = pack(root, url, samples_per_shard=200, progress=False)
    assert result.shards == 7 and result.manifest.classes == [str(c) for c in range(10)]
    shards = mean_accuracy(lambda s: through_shards(url, s), x_test, y_test)
    assert shards >= reference - 1.5, (
        f"ShardDataset {shards:.1f}% against in-memory {reference:.1f}%"
    )


def test_a_sorted_pack_read_with_the_default_window_trains_as_well(digits, tmp_path):
    """Sorted anyway (--no-shuffle, or WebDataset tars): the read-time window must mix it."""
    root, reference, x_test, y_test = digits
    url = tmp_path / "sorted"
    pack(root, url, samples_per_shard=200, shuffle=False, progress=False)
    shards = mean_accuracy(lambda s: through_shards(url, s), x_test, y_test)
    assert shards >= reference - 1.5, (
        f"ShardDataset {shards:.1f}% against in-memory {reference:.1f}%"
    )
