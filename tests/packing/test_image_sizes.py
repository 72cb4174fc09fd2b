"""Image sizes recorded at pack time (and by ``shardstream index``), read from the headers: the side file the
manifest names, its checks, and datasets without one."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
from PIL import Image

import shardstream as ss
from shardstream.errors import ManifestError
from shardstream.manifest.image_sizes import ShardSizes, encode_image_sizes, read_image_sizes
from shardstream.manifest.index_tars import index
from shardstream.manifest.verify import verify
from shardstream.storage import Store
from tests.folders import folder_files


def encoded(width: int, height: int, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (40, 50, 60)).save(out, format=fmt)
    return out.getvalue()


def folder(root, n: int = 14):
    """An ImageFolder tree of JPEGs and PNGs of known sizes."""
    sizes = {}
    for i in range(n):
        cls = "ab"[i % 2]
        (root / cls).mkdir(parents=True, exist_ok=True)
        ext, fmt = ("jpg", "JPEG") if i % 3 else ("png", "PNG")
        w, h = 8 + i, 30 - i
        (root / cls / f"x{i:02d}.{ext}").write_bytes(encoded(w, h, fmt))
        sizes[f"{cls}/x{i:02d}"] = (ext, w, h)
    return sizes


def recorded(url: str) -> tuple[ss.ShardDataset, dict]:
    """Every sample's recorded (field, width, height), by key; read through the manifest's side file."""
    ds = ss.ShardDataset(url, decode=None, shuffle=False)
    m = ds.manifest
    sizes = read_image_sizes(
        m.image_sizes.reference, Store(url).read_bytes, m.paths, m.stored_counts
    )
    out = {}
    for i, sample in enumerate(ds):
        for field in sizes.fields:
            if sizes.widths[field][i]:
                out[sample["__key__"]] = (
                    field,
                    int(sizes.widths[field][i]),
                    int(sizes.heights[field][i]),
                )
    return ds, out


@pytest.mark.parametrize("workers", [1, 2])
def test_pack_records_each_images_size_from_its_header(tmp_path, workers):
    sizes = folder(tmp_path / "src")
    result = ss.pack(
        str(tmp_path / "src"),
        str(tmp_path / "out"),
        workers=workers,
        progress=False,
        samples_per_shard=4,
        shuffle=False,
    )
    ref = json.loads((tmp_path / "out" / "_manifest.json").read_text())["image_sizes"]
    assert ref["fields"] == ["jpg", "png"] and ref["samples"] == 14
    assert ref["file"].startswith(".shardstream/image_sizes-")  # shardstream's own, beside no data
    data = (tmp_path / "out" / ref["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == ref["sha256"]
    _, found = recorded(result.url)
    assert found == sizes


def test_shard_writer_records_sizes_and_can_leave_them_out(tmp_path):
    with ss.ShardWriter(str(tmp_path / "w"), samples_per_shard=3) as writer:
        for i in range(7):
            writer.write({"__key__": f"k{i}", "webp": encoded(5 + i, 9, "WEBP"), "cls": i})
    _, found = recorded(str(tmp_path / "w"))
    assert found == {f"k{i}": ("webp", 5 + i, 9) for i in range(7)}
    with ss.ShardWriter(str(tmp_path / "plain"), image_sizes=False) as writer:
        writer.write({"__key__": "k", "jpg": encoded(4, 4, "JPEG")})
    assert "image_sizes" not in json.loads((tmp_path / "plain" / "_manifest.json").read_text())
    assert ss.ShardDataset(str(tmp_path / "plain")).manifest.image_sizes is None


def test_reindex_adds_sizes_to_an_existing_pack(tmp_path):
    sizes = folder(tmp_path / "src")
    ss.pack(
        str(tmp_path / "src"),
        str(tmp_path / "old"),
        workers=1,
        progress=False,
        image_sizes=False,
        shuffle=False,
    )
    assert ss.ShardDataset(str(tmp_path / "old")).manifest.image_sizes is None  # still reads
    index([str(tmp_path / "old")], overwrite=True)
    _, found = recorded(str(tmp_path / "old"))
    assert found == sizes


def test_an_unreadable_header_is_unknown_not_an_error(tmp_path):
    with ss.ShardWriter(str(tmp_path / "w")) as writer:
        writer.write({"__key__": "a", "jpg": b"\xff\xd8\xff\xe0 cut short"})
        writer.write({"__key__": "b", "jpg": encoded(6, 3, "JPEG")})
    _, found = recorded(str(tmp_path / "w"))
    assert found == {"b": ("jpg", 6, 3)}


def test_a_damaged_or_mismatched_size_file_is_refused_naming_it(tmp_path):
    shards = []
    for n in (3, 2):
        s = ShardSizes()
        for i in range(n):
            s.add([("jpg", encoded(4 + i, 5, "JPEG"))])
        shards.append(s)
    sizes = encode_image_sizes(shards)
    ref, data = sizes.reference, sizes.data
    files = {ref["file"]: data}
    paths = ["s0.tar", "s1.tar"]
    good = read_image_sizes(ref, files.__getitem__, paths, np.array([3, 2]))
    assert good.widths["jpg"].tolist() == [4, 5, 6, 4, 5]
    with pytest.raises(ManifestError, match=r"shard 1 \(s1.tar\), which has 4"):
        read_image_sizes(ref, files.__getitem__, paths, np.array([3, 4]))
    damaged = {ref["file"]: data[:-1] + bytes([data[-1] ^ 1])}
    with pytest.raises(ManifestError, match=f"{ref['file']} does not match its sha256"):
        read_image_sizes(ref, damaged.__getitem__, paths, np.array([3, 2]))
    with pytest.raises(ManifestError, match="not {file, sha256, fields, samples}"):
        read_image_sizes({**ref, "file": "../x.npy"}, files.__getitem__, paths, np.array([3, 2]))


def test_verify_reports_a_damaged_size_file(tmp_path):
    from shardstream.manifest.verify import verify

    folder(tmp_path / "src", 4)
    ss.pack(str(tmp_path / "src"), str(tmp_path / "out"), workers=1, progress=False)
    assert verify(str(tmp_path / "out")).ok
    ref = json.loads((tmp_path / "out" / "_manifest.json").read_text())["image_sizes"]
    path = tmp_path / "out" / ref["file"]
    path.write_bytes(path.read_bytes()[:-4])
    (problem,) = verify(str(tmp_path / "out")).problems
    assert f"{ref['file']} does not match its sha256" in problem


def test_the_command_records_sizes_unless_told_not_to(tmp_path):
    from tests.cli.test_cli import run

    folder(tmp_path / "src", 4)
    for flag, recorded_ in (("--image-sizes", True), ("--no-image-sizes", False)):
        out = tmp_path / flag
        done = run("pack", tmp_path / "src", out, "-q", "--workers", "1", flag)
        assert done.returncode == 0, done.stderr
        head = json.loads((out / "_manifest.json").read_text())
        assert ("image_sizes" in head) is recorded_


def test_an_append_records_every_size_and_gc_keeps_the_files_of_kept_versions(tmp_path):
    from shardstream.manifest import dataset_store
    from shardstream.packing.gc import collect

    sizes = folder(tmp_path / "src", 6)
    out = str(tmp_path / "out")
    ss.pack(str(tmp_path / "src"), out, workers=1, progress=False, shuffle=False)
    first = json.loads((tmp_path / "out" / "_manifest.json").read_text())["image_sizes"]["file"]
    more = tmp_path / "more"
    for cls, ext, fmt in (("a", "jpg", "JPEG"), ("b", "png", "PNG")):  # the same classes and fields
        (more / cls).mkdir(parents=True)
        (more / cls / f"y.{ext}").write_bytes(encoded(3, 9, fmt))
    ss.pack(str(more), out, workers=1, progress=False, append=True)
    # the append records every sample's size, the earlier shards' and its own, in a file of its own
    latest = ss.ShardDataset(out).manifest.image_sizes.reference["file"]
    assert latest != first
    _, after = recorded(out)
    assert {k: v for k, v in after.items() if not k.endswith("/y")} == {
        k: v for k, v in zip(sizes, [(ext, w, h) for ext, w, h in sizes.values()])
    }
    assert after["a/y"] == ("jpg", 3, 9) and after["b/y"] == ("png", 3, 9)
    assert (tmp_path / "out" / first).exists()  # version 1 still names it
    ds = ss.ShardDataset(out, version=1, decode=None, shuffle=False)
    m = ds.manifest
    read = read_image_sizes(
        m.image_sizes.reference, Store(out).read_bytes, m.paths, m.stored_counts
    )
    jpgs = [(w, h) if ext == "jpg" else (0, 0) for ext, w, h in sizes.values()]  # 0: not a jpg
    assert sorted(zip(read.widths["jpg"].tolist(), read.heights["jpg"].tolist())) == sorted(jpgs)
    store = dataset_store(out)
    assert first not in collect(store, keep=2).files  # both versions kept: needed
    assert first in collect(store, keep=1).files  # only the latest kept: no longer named


def test_an_overwrite_with_the_same_images_keeps_its_own_size_file(tmp_path):
    """The same images give the same sizes; each run's side file is its own all the same (its name has the
    run's part), so the clean-up of what an overwrite replaced never removes the file the new manifest names
    (a name from the content alone did that, and two packs at once removed each other's)."""
    folder(tmp_path / "src")
    first = ss.pack(str(tmp_path / "src"), str(tmp_path / "ds"), progress=False)
    again = ss.pack(str(tmp_path / "src"), str(tmp_path / "ds"), progress=False, overwrite=True)
    old, new = first.manifest.image_sizes.reference, again.manifest.image_sizes.reference
    assert old["sha256"] == new["sha256"] and old["file"] != new["file"]
    names = [n for n in folder_files(tmp_path / "ds") if "image_sizes-" in n]
    assert names == [new["file"]] and new["file"].startswith(".shardstream/image_sizes-")
    assert verify(str(tmp_path / "ds")).ok


def test_aspect_buckets_stay_planned_from_recorded_sizes_after_an_append(tmp_path):
    def jpgs(root, names, size):
        (root / "a").mkdir(parents=True)
        for name in names:
            (root / "a" / f"{name}.jpg").write_bytes(encoded(*size, "JPEG"))

    jpgs(tmp_path / "src", ["x0", "x1", "x2", "x3"], (20, 10))
    jpgs(tmp_path / "more", ["y0", "y1"], (10, 20))
    out = str(tmp_path / "out")
    ss.pack(str(tmp_path / "src"), out, progress=False)
    ss.pack(str(tmp_path / "more"), out, progress=False, append=True)
    shaped = ss.Bucketed(
        ss.ShardDataset(out, decode=None),
        key=ss.aspect_ratio("jpg"),
        boundaries=[1.0],
        batch_size=2,
        num_workers=0,
    )
    assert shaped.planned_up_front  # from the sizes the append joined: nothing read to plan
    batches = [list(batch["__key__"]) for batch in shaped]
    assert sorted(k for b in batches for k in b) == ["a/x0", "a/x1", "a/x2", "a/x3", "a/y0", "a/y1"]
    assert sorted(b[0][2] for b in batches) == ["x", "x", "y"]  # wide ones apart from tall ones
    assert all(len({k[2] for k in b}) == 1 for b in batches)
