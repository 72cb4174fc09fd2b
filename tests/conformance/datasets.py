"""The matrix's columns: one small dataset of each kind, and what every reader must find in it.

Each :class:`Case` is built once per test session from data made here, and carries its **reference**:
the samples (key -> field bytes and class name) or, for a token dataset, the windows that the dataset
must name, computed from what was written (the files, the split's documented key hash, the merge's
class names, the token shards' own bytes), never by reading the dataset through shardstream. A new
kind of dataset is one more entry of :data:`BUILDERS`.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import shardstream as ss


@dataclass(frozen=True)
class Sample:
    """A sample as written: its fields' bytes (labels aside) and its label (a class name, or an int
    where the dataset has no class list)."""

    fields: dict[str, bytes]
    label: str | int


@dataclass
class Case:
    """One dataset of the matrix: where it is, how to open it, and what it must read as."""

    name: str
    url: str
    samples: dict[str, Sample] = field(default_factory=dict)  # key -> what was written
    windows: Counter[tuple[int, ...]] | None = None  # token datasets: every window, once
    seq_len: int | None = None
    version: int | None = None  # a pinned older version (None: the latest)
    trusted: dict[str, dict[str, Any]] = field(default_factory=dict)  # roots a merge names by URL
    cache_dir: str = ""
    label_field: str | None = "cls"

    @property
    def count(self) -> int:
        return sum(self.windows.values()) if self.windows is not None else len(self.samples)

    def storage(self) -> ss.StorageSettings:
        return ss.StorageSettings(cache_dir=self.cache_dir, trusted_roots=self.trusted or None)

    def opened(self) -> dict[str, Any]:
        """Keyword arguments that open this dataset in the Python API."""
        return {"storage": self.storage(), "version": self.version}

    def flags(self) -> list[str]:
        """Command-line flags that open this dataset."""
        out = [flag for root in self.trusted for flag in ("--trust-root", root)]
        return out + ([] if self.version is None else ["--dataset-version", str(self.version)])


def command(args: list[str]) -> str:
    """Run a shardstream command in this process; its standard output (it must succeed; warnings go to
    standard error, and only the first reader of a dataset in a process sees its once-per-process ones)."""
    from click.testing import CliRunner

    from shardstream.cli import cli

    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, f"shardstream {' '.join(args)}: {done.output}"
    return done.stdout


def jpeg(width: int, height: int, shade: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (shade % 256, 40, 200)).save(out, format="JPEG")
    return out.getvalue()


def image_folder(root: Path, classes: dict[str, list[str]], salt: int = 0) -> dict[str, Sample]:
    """An ImageFolder tree (``root/<class>/<name>.jpg``) of JPEGs of three aspect ratios; its samples by
    key (``<class>/<name>``, as a folder pack names them)."""
    out = {}
    for c, names in classes.items():
        (root / c).mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(names):
            data = jpeg(8 * (1 + i % 3), 8, 17 * i + salt)
            (root / c / f"{name}.jpg").write_bytes(data)
            out[f"{c}/{name}"] = Sample({"jpg": data}, c)
    return out


BASE = {"a": [f"{i:03d}" for i in range(7)], "b": [f"{i:03d}" for i in range(6)]}
PACK = {"samples_per_shard": 4, "progress": False, "workers": 1}


class Builder:
    """Makes the datasets in one folder, each once (some build on others: :meth:`need`)."""

    def __init__(self, root: Path):
        self.root, self.made = root, {}
        self.cases: dict[str, Case] = {}
        self.cache_dir = str(root / "cache")

    def need(self, name: str) -> Case:
        """The dataset ``name`` of :data:`BUILDERS`, made the first time it is asked for."""
        if name not in self.cases:
            self.cases[name] = BUILDERS[name](self)
        return self.cases[name]

    def case(self, name: str, url: str | Path, **kw: Any) -> Case:
        return Case(name, str(url), cache_dir=self.cache_dir, **kw)

    def base(self) -> Case:
        """The plain pack the split and the merges start from."""
        return self.need("tar")


def build_tar(b: Builder) -> Case:
    samples = image_folder(b.root / "src", BASE)
    ss.pack(str(b.root / "src"), str(b.root / "ds/tar"), **PACK)
    return b.case("tar", b.root / "ds/tar", samples=samples)


def build_tar_zst(b: Builder) -> Case:
    base = b.base()
    ss.pack(str(b.root / "src"), str(b.root / "ds/zst"), compression="zstd", **PACK)
    return b.case("tar.zst", b.root / "ds/zst", samples=base.samples)


def build_arrow(b: Builder) -> Case:
    base = b.base()
    ss.pack(str(b.root / "src"), str(b.root / "ds/arrow"), format="arrow", **PACK)
    return b.case("arrow", b.root / "ds/arrow", samples=base.samples)


def build_old_indexes(b: Builder) -> Case:
    """The tar pack as 0.5.0 left it: format 3, each sample index beside its shard (version 1: no per-sample
    checksums), read unchecked."""
    import dataclasses
    import shutil

    from shardstream.formats.tar import build_index
    from shardstream.manifest import dataset_store, load_manifest, write_manifest
    from shardstream.manifest.side_names import index_name, old_index_name
    from tests.folders import as_format_3

    base = b.base()
    folder = b.root / "ds/old-indexes"
    shutil.copytree(base.url, folder)
    store = dataset_store(str(folder))
    m = load_manifest(store)
    digests = []
    for name in m.paths:
        raw = build_index((folder / name).read_bytes(), name)
        assert raw is not None and raw[:8] == b"SSTARIX1"
        (folder / index_name(name)).unlink()
        (folder / old_index_name(name)).write_bytes(raw)  # where 0.5.0 kept it: beside its shard
        digests.append(hashlib.sha256(raw).hexdigest())
    write_manifest(store, dataclasses.replace(m, index_sha256=digests))
    as_format_3(folder)  # and the manifest as 0.5.0 wrote it
    return b.case("0.5.0 sample indexes", folder, samples=base.samples)


def build_parquet(b: Builder) -> Case:
    """Parquet files indexed in place (no class list: labels are the stored integers)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = b.root / "ds/parquet"
    (folder / "data").mkdir(parents=True)
    samples = {}
    for part in range(2):
        keys = [f"p{part}-{i:02d}" for i in range(6 + part)]
        images = [jpeg(8 * (1 + i % 3), 8, 31 * i + part) for i in range(len(keys))]
        labels = [i % 3 for i in range(len(keys))]
        table = pa.table({"__key__": keys, "jpg": images, "cls": labels})
        pq.write_table(table, folder / "data" / f"part-{part}.parquet", row_group_size=3)
        samples.update({k: Sample({"jpg": v}, c) for k, v, c in zip(keys, images, labels)})
    command(["index", str(folder / "data" / "*.parquet"), "--output", str(folder), "-q"])
    return b.case("parquet in place", folder, samples=samples)


def build_webdataset_index(b: Builder) -> Case:
    """Tars written by webdataset's own TarWriter, then ``shardstream index``."""
    import webdataset as wds

    folder = b.root / "ds/wds"
    folder.mkdir(parents=True)
    samples = {}
    for shard in range(2):
        with wds.TarWriter(str(folder / f"train-{shard:04d}.tar")) as sink:
            for i in range(5 + shard):
                key = f"w{shard}-{i:02d}"
                data = jpeg(8 * (1 + i % 3), 8, 13 * i + shard)
                sink.write({"__key__": key, "jpg": data, "cls": str(i % 2).encode()})
                samples[key] = Sample({"jpg": data}, i % 2)
    command(["index", str(folder / "train-{0000..0001}.tar"), "-q"])
    return b.case("index of webdataset tars", folder, samples=samples)


def split_part_of(key: str, fractions: list[float], seed: int) -> int:
    """The split's documented rule, computed here: a 64-bit BLAKE2b of the key salted with the seed,
    as a fraction of 2**64, against the parts' cumulative fractions."""
    salt = int(seed).to_bytes(8, "little", signed=True)
    digest = hashlib.blake2b(key.encode(), digest_size=8, salt=salt).digest()
    unit = int.from_bytes(digest, "little") / float(1 << 64)
    return int(np.searchsorted(np.cumsum(fractions)[:-1], unit, side="right"))


def build_split_part(b: Builder) -> Case:
    base = b.base()
    ss.split(base.url, str(b.root / "ds/parts"), {"train": 0.5, "val": 0.5}, seed=3)
    train = {k: s for k, s in base.samples.items() if split_part_of(k, [0.5, 0.5], 3) == 0}
    assert 0 < len(train) < len(base.samples)
    return b.case("split part", b.root / "ds/parts/train", samples=train)


def build_appended_split_part(b: Builder) -> Case:
    """A split part appended to: the part's own selection, then every new sample (none of the other
    part's)."""
    train = b.need("split part")
    added = image_folder(b.root / "src-more", {"a": ["n0", "n1"], "b": ["n2"]}, salt=7)
    url = str(b.root / "ds/parts-appended/train")
    ss.split(b.base().url, str(b.root / "ds/parts-appended"), {"train": 0.5, "val": 0.5}, seed=3)
    ss.pack(str(b.root / "src-more"), url, append=True, **PACK)
    return b.case("appended split part", url, samples={**train.samples, **added})


def build_merged_split_part(b: Builder) -> Case:
    """A merge of a split part and another dataset: the part's selected samples and the other's."""
    train = b.need("split part")
    other = _bc(b)
    ss.merge([train.url, str(b.root / "ds/bc")], str(b.root / "ds/parts/merged"))
    return b.case(
        "merged split part", b.root / "ds/parts/merged", samples={**train.samples, **other}
    )


def _bc(b: Builder) -> dict[str, Sample]:
    """A pack of classes b and c (the other source of the merges)."""
    if "bc" not in b.made:
        samples = image_folder(
            b.root / "src-bc", {"b": ["m0", "m1", "m2"], "c": ["m3", "m4"]}, salt=5
        )
        ss.pack(str(b.root / "src-bc"), str(b.root / "ds/bc"), **PACK)
        b.made["bc"] = samples
    return b.made["bc"]


def build_merge_relabel(b: Builder) -> Case:
    """A merge of the base (classes a, b) and a pack of classes b, c: labels map to [a, b, c]."""
    base, other = b.base(), _bc(b)
    m = ss.merge([base.url, str(b.root / "ds/bc")], str(b.root / "ds/merged"))
    assert m.classes == ["a", "b", "c"] and m.relabel is not None
    return b.case("merge relabelling", b.root / "ds/merged", samples={**base.samples, **other})


def build_merge_across_stores(b: Builder) -> Case:
    """A local merge of the base and a dataset in another store (``memory://``), named by full URL."""
    base = b.base()
    other = image_folder(b.root / "src-mem", {"a": ["r0", "r1"], "b": ["r2", "r3", "r4"]}, salt=9)
    remote = "memory://conformance/remote"
    ss.pack(str(b.root / "src-mem"), remote, **PACK)
    ss.merge([base.url, remote], str(b.root / "ds/across"))
    return b.case(
        "merge across stores",
        b.root / "ds/across",
        samples={**base.samples, **other},
        trusted={remote: {}},
    )


def _appended(b: Builder) -> tuple[dict[str, Sample], dict[str, Sample]]:
    if "appended" not in b.made:
        first = image_folder(b.root / "src-day1", {"a": ["d0", "d1", "d2"], "b": ["d3", "d4"]})
        later = image_folder(b.root / "src-day2", {"a": ["e0", "e1"], "b": ["e2", "e3"]}, salt=3)
        url = str(b.root / "ds/living")
        ss.pack(str(b.root / "src-day1"), url, **PACK)
        result = ss.pack(str(b.root / "src-day2"), url, append=True, **PACK)
        assert result.manifest.version == 2
        b.made["appended"] = (first, later)
    return b.made["appended"]


def build_appended(b: Builder) -> Case:
    first, later = _appended(b)
    return b.case("appended version", b.root / "ds/living", samples={**first, **later})


def build_pinned(b: Builder) -> Case:
    first, _ = _appended(b)
    return b.case("pinned older version", b.root / "ds/living", samples=first, version=1)


def build_media(b: Builder) -> Case:
    """Class folders of videos with a recording of the same key beside each (one sample, two fields);
    their media facts recorded at pack time."""
    from tests.media import audio, video

    samples = {}
    for c, n in (("jump", 3), ("run", 4)):
        (b.root / "src-media" / c).mkdir(parents=True)
        for i in range(n):
            fields = {"mp4": video(seconds=0.5 + i / 4), "wav": audio(seconds=0.25 + i / 8)}
            for ext, data in fields.items():
                (b.root / "src-media" / c / f"{i:02d}.{ext}").write_bytes(data)
            samples[f"{c}/{i:02d}"] = Sample(fields, c)
    ss.pack(str(b.root / "src-media"), str(b.root / "ds/media"), **PACK)
    return b.case("video and audio", b.root / "ds/media", samples=samples)


SEQ_LEN = 7


def build_tokens(b: Builder) -> Case:
    """A token dataset whose token ids are their positions; its windows from the shards' own bytes."""
    from tests.token_corpus import pack_positions

    url, _ = pack_positions(b.root / "tok", [9, 14, 5, 21, 11, 8], shard_size="96B")
    windows: Counter[tuple[int, ...]] = Counter()
    for name in sorted(os.listdir(url)):
        if name.endswith(".tokens"):
            tokens = _token_file(Path(url) / name)
            for start in range(0, len(tokens) - SEQ_LEN, SEQ_LEN):
                windows[tuple(tokens[start : start + SEQ_LEN + 1].tolist())] += 1
    return b.case("token windows", url, windows=windows, seq_len=SEQ_LEN, label_field=None)


def _token_file(path: Path) -> np.ndarray:
    """A token shard's ids, read with numpy alone as the format documents."""
    _, itemsize, n, d = np.fromfile(path, "<u8", count=4)
    dtype = {2: "<u2", 4: "<u4"}[int(itemsize)]
    return np.fromfile(path, dtype, count=int(n), offset=32 + 8 * (int(d) + 1)).astype(np.int64)


BUILDERS: dict[str, Callable[[Builder], Case]] = {
    "tar": build_tar,
    "tar.zst": build_tar_zst,
    "0.5.0 sample indexes": build_old_indexes,
    "arrow": build_arrow,
    "parquet in place": build_parquet,
    "index of webdataset tars": build_webdataset_index,
    "split part": build_split_part,
    "appended split part": build_appended_split_part,
    "merged split part": build_merged_split_part,
    "merge relabelling": build_merge_relabel,
    "merge across stores": build_merge_across_stores,
    "appended version": build_appended,
    "pinned older version": build_pinned,
    "video and audio": build_media,
    "token windows": build_tokens,
}
