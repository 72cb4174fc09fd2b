"""Permanent storage problems give one-line errors naming the URL: a missing bucket, prefix or shard object,
a 403, wrong credentials. The command line exits 1 with no traceback; nothing is retried that retrying cannot fix."""

from __future__ import annotations

import json
import re

import pytest

import shardstream
from tests.sample_datasets import RUN

from .clitools import invoke, ok, one_line_error, run
from .data import image_folder
from .proxy import gcs_error, s3_error


def pack_into(bucket, tmp_path) -> str:
    """The URL of a dataset of 14 images in 4 shards in ``bucket``."""
    return pack_result(bucket, tmp_path).url


def pack_result(bucket, tmp_path):
    image_folder(tmp_path / "src")
    return shardstream.pack(
        tmp_path / "src",
        bucket.url("ds"),
        storage_options=bucket.storage_options,
        samples_per_shard=4,
        workers=1,
        progress=False,
    )


def forbidden(bucket) -> bytes:
    if bucket.kind == "s3":
        return s3_error("AccessDenied", "Access Denied")
    return gcs_error(403, "Forbidden", "forbidden")


def test_missing_bucket(bucket):
    url = f"{bucket.protocol}://ss-no-such-bucket-{bucket.name[-12:]}/ds"
    for command in ("info", "ls", "verify"):
        one_line_error(invoke(command, url, *bucket.cli_options), url)
    with pytest.raises(shardstream.ShardstreamError, match=url):
        shardstream.ShardDataset(url, storage_options=bucket.storage_options)


def test_pack_to_a_missing_bucket_is_an_error_and_creates_no_bucket(bucket, tmp_path):
    image_folder(tmp_path / "src")
    missing = f"ss-no-such-bucket-{bucket.name[-12:]}"
    url = f"{bucket.protocol}://{missing}/ds"
    line = one_line_error(invoke("pack", tmp_path / "src", url, "-q", *bucket.cli_options), missing)
    assert "Traceback" not in line
    assert not bucket.fs.exists(missing)


def test_missing_prefix(bucket):
    url = bucket.url("nothing", "here")
    for command in ("info", "ls", "cat", "verify"):
        line = one_line_error(invoke(command, url, *bucket.cli_options), url)
        assert "holds no dataset" in line


def test_missing_shard_object(bucket, tmp_path):
    packed = pack_result(bucket, tmp_path)
    url = packed.url
    bucket.delete(f"ds/{packed.manifest.paths[1]}")
    shard = f"{url}/{packed.manifest.paths[1]}"
    one_line_error(invoke("cat", url, "5", *bucket.cli_options), shard)
    # the other shards still read
    assert ok("cat", url, "0", *bucket.cli_options).stdout.startswith("__key__")
    ds = shardstream.ShardDataset(
        url, storage_options=bucket.storage_options, decode=None, shuffle=False, retries=1
    )
    with pytest.raises(shardstream.ShardstreamError, match=shard) as err:
        list(ds)
    assert "\n" not in str(err.value)


def test_forbidden_everywhere_is_one_line_and_not_retried(bucket, tmp_path, proxied):
    """A 403 on every request (credentials that the service rejects), emulated by the proxy."""
    url = pack_into(bucket, tmp_path)
    via = proxied(bucket)
    via.proxy.inject("status", status=403, body=forbidden(bucket))
    with pytest.raises(shardstream.ShardstreamError) as err:
        shardstream.ShardDataset(url, storage_options=via.storage_options, retries=3)
    message = str(err.value)
    assert url in message and "\n" not in message and "gave up after" not in message
    assert via.proxy.count() <= 2  # not retried (at most one existence check after the failed read)
    # the real executable: nothing logged either
    one_line_error(run("info", url, *via.cli_options), url)


def test_s3_wrong_credentials_and_profiles(s3_bucket, tmp_path, monkeypatch):
    """moto with authentication on: keys it did not issue are refused; a profile with issued keys works."""
    import boto3

    bucket, server = s3_bucket, s3_bucket.server
    image_folder(tmp_path / "src")
    url = bucket.url("ds")
    ok(
        "pack",
        tmp_path / "src",
        url,
        "--samples-per-shard",
        "7",
        "-q",
        "--endpoint-url",
        server.endpoint_url,
    )
    iam = boto3.client("iam", endpoint_url=server.endpoint_url, region_name="us-east-1")
    user = f"reader-{bucket.name}"
    iam.create_user(UserName=user)
    iam.put_user_policy(
        UserName=user,
        PolicyName="everything",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
            }
        ),
    )
    key = iam.create_access_key(UserName=user)["AccessKey"]
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[issued]\naws_access_key_id = {key['AccessKeyId']}\n"
        f"aws_secret_access_key = {key['SecretAccessKey']}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    endpoint = ["--endpoint-url", server.endpoint_url]
    with server.enforce_auth():
        # the dummy keys of the environment
        line = one_line_error(invoke("info", url, *endpoint), url)
        assert (
            "forbidden" in line.lower() or "denied" in line.lower() or "credentials" in line.lower()
        )
        assert (
            json.loads(ok("info", url, "--json", "--profile", "issued", *endpoint).stdout)[
                "num_samples"
            ]
            == 14
        )
        # the real executable, same environment
        child = run("ls", url, "--profile", "issued", *endpoint)
        assert child.returncode == 0 and re.search(rf"shard-000001{RUN}\.tar", child.stdout), (
            child.stderr
        )


def test_s3_missing_profile_is_reported_at_once(s3_bucket, tmp_path, monkeypatch):
    credentials = tmp_path / "credentials"
    credentials.write_text("[other]\naws_access_key_id = a\naws_secret_access_key = b\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    url = s3_bucket.url("ds")
    options = {"endpoint_url": s3_bucket.endpoint_url, "profile": "no-such-profile"}
    with pytest.raises(shardstream.ShardstreamError, match="no-such-profile") as err:
        shardstream.ShardDataset(url, storage_options=options, retries=2)
    assert url in str(err.value) and "gave up after" not in str(err.value)


def test_gcs_client_error_is_one_line_without_gcsfs_traceback(gcs_bucket, tmp_path, proxied):
    url = pack_into(gcs_bucket, tmp_path)
    via = proxied(gcs_bucket)
    via.proxy.inject("status", status=400, body=gcs_error(400, "Bad Request", "badRequest"))
    # the real executable: in this process pytest's log capture would swallow what gcsfs logs
    one_line_error(run("info", url, *via.cli_options), url)
