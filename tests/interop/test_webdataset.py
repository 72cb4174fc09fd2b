"""webdataset (a shard list, a brace pattern, a glob of the folder) and wids (the shard list
``shardstream ls --wids`` writes) read exactly the samples of a default tar pack and of several shards;
tars that webdataset wrote, once ``shardstream index`` ran in their folder, still read by glob."""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardstream as ss
from shardstream.cli import cli
from tests.interop.clients import as_bytes, check_ours, check_samples, shards_of
from tests.interop.conftest import copy_of

wds = pytest.importorskip("webdataset", reason="webdataset is not installed (the test extras)")


def read_wds(urls) -> list[dict]:
    return list(wds.WebDataset(urls, shardshuffle=False, empty_check=True))


@pytest.mark.parametrize("pack", ["tar_pack", "tar_shards"])
def test_webdataset_reads_the_shard_list_and_a_brace_pattern(pack, images, request):
    folder = request.getfixturevalue(pack)
    paths = shards_of(folder)
    check_samples(read_wds(paths), images[1])
    first, last = Path(paths[0]).name, Path(paths[-1]).name
    run = first.rsplit("-", 1)[1]  # the pack run's token: shard-000000-<token>.tar
    brace = f"{folder}/shard-{{{first.split('-')[1]}..{last.split('-')[1]}}}-{run}"
    check_samples(read_wds(brace), images[1])
    check_ours(folder, images[1])


@pytest.mark.parametrize("pack", ["tar_pack", "tar_shards"])
def test_webdataset_reads_a_glob_of_the_folder(pack, images, request):
    """What a user globs: every file whose name starts like a shard's, or ends like one."""
    folder = request.getfixturevalue(pack)
    check_samples(read_wds(sorted(glob.glob(f"{folder}/shard-*"))), images[1])
    check_samples(read_wds(sorted(glob.glob(f"{folder}/*.tar"))), images[1])
    check_ours(folder, images[1])


def write_with_webdataset(folder: Path, truth: dict) -> None:
    folder.mkdir()
    with wds.ShardWriter(str(folder / "out-%06d.tar"), maxcount=10, verbose=0) as sink:
        for key in sorted(truth):
            sink.write({"__key__": key, "jpg": truth[key]["jpg"], "cls": truth[key]["cls"]})


def test_tars_webdataset_wrote_still_read_by_glob_after_index(images, tmp_path):
    folder = tmp_path / "written"
    write_with_webdataset(folder, images[1])
    result = ss.index(str(folder))
    assert result.manifest.num_shards == 3
    check_samples(read_wds(sorted(glob.glob(f"{folder}/out-*"))), images[1])
    check_ours(folder, images[1])


def wids_list(folder: Path, *args: str) -> None:
    result = CliRunner().invoke(cli, ["ls", str(folder), "--wids", *args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("pack", ["tar_pack", "tar_shards"])
def test_wids_reads_the_shard_list_shardstream_writes_as_shardmap_does(
    pack, images, request, tmp_path, capfd
):
    """``shardstream ls ds --wids --output lists/ds.json``: URLs relative to the list's folder."""
    wids = pytest.importorskip("wids", reason="wids is not installed (the test extras)")
    folder = request.getfixturevalue(pack)
    descriptor = tmp_path / "lists" / "ds.json"
    wids_list(folder, "--output", str(descriptor))
    assert json.loads(descriptor.read_text())["name"] == folder.name
    ds = wids.ShardListDataset(
        str(descriptor), cache_dir=str(tmp_path / "cache"), transformations=[]
    )
    m = ss.ShardMap(str(folder), decode=None)
    assert len(ds) == len(m)
    samples = [ds[i] for i in range(len(ds))]
    check_samples(samples, images[1], jpg=".jpg", cls=".cls")
    for i, sample in enumerate(samples):  # wids[i] is ShardMap[i], field for field
        ours = m[i]
        assert sample["__key__"] == ours["__key__"]
        assert (as_bytes(sample[".jpg"]), as_bytes(sample[".cls"])) == (ours["jpg"], ours["cls"])
    capfd.readouterr()  # wids prints each dataset it opens
    check_ours(folder, images[1])


def test_the_printed_wids_list_reads_beside_the_shards(tar_shards, images, tmp_path, capfd):
    """``shardstream ls ds --wids > ds/.wids.json``: URLs relative to the dataset's folder."""
    wids = pytest.importorskip("wids", reason="wids is not installed (the test extras)")
    folder = copy_of(tar_shards, tmp_path)
    (folder / ".wids.json").write_text(wids_list(folder))
    ds = wids.ShardListDataset(
        str(folder / ".wids.json"), cache_dir=str(tmp_path / "c"), transformations=[]
    )
    check_samples((ds[i] for i in range(len(ds))), images[1], jpg=".jpg", cls=".cls")
    capfd.readouterr()
    check_ours(folder, images[1])


@pytest.mark.skipif(sys.platform != "linux", reason="DataLoader workers by fork")
def test_webdataset_in_a_dataloader_with_as_many_workers_as_shards(tar_shards, images):
    import torch

    pipeline = wds.WebDataset(shards_of(tar_shards), shardshuffle=False)
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=3)
    check_samples(loader, images[1])


@pytest.mark.skipif(sys.platform != "linux", reason="DataLoader workers by fork")
def test_webdataset_with_more_workers_than_shards_stops_as_the_guide_says(tar_pack):
    """A limit of webdataset's, not of the shards': a worker without a shard fails the loader (the guide
    says to pack smaller shards, or to pass empty_check=False)."""
    import torch

    pipeline = wds.WebDataset(shards_of(tar_pack), shardshuffle=False)
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=2)
    with pytest.raises(Exception, match="empty_check=False"):
        list(loader)


def test_webdataset_does_not_read_a_zstd_pack_as_the_guide_says(tar_zst):
    with pytest.raises(Exception, match="invalid header|ReadError"):
        read_wds(shards_of(tar_zst))
