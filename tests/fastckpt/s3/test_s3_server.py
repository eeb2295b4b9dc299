"""The S3 server the object-store tests run against (issue 66): SeaweedFS from the registry,
started by the tests on loopback. It is a real server: objects written go through its volume
server and come back byte for byte, multipart uploads and ranged reads work, a request signed
with the wrong secret is refused, its objects outlive a restart (what the tests that stop it
mid-save rely on), and it gives what a commit without rename needs (checked part CRCs, unfinished
uploads listed and aborted, a create-once PUT)."""
from __future__ import annotations

import os

import obstore
import pytest
from obstore.store import S3Store

from support.s3_server import S3Server


def test_a_multipart_upload_comes_back_byte_for_byte_and_in_ranges(s3_server):
    data = os.urandom(13 << 20)
    obstore.put(s3_server.store(), "run7/rank-0", data, chunk_size=5 << 20, max_concurrency=3)  # 3 parts
    assert bytes(obstore.get(s3_server.store(), "run7/rank-0").bytes()) == data
    assert bytes(obstore.get_range(s3_server.store(), "run7/rank-0", start=7 << 20, length=100)) == \
        data[7 << 20:(7 << 20) + 100]
    listed = obstore.list(s3_server.store(), prefix="run7/").collect()
    assert [(o["path"], o["size"]) for o in listed] == [("run7/rank-0", len(data))]


def test_a_request_signed_with_the_wrong_secret_is_refused(s3_server):
    wrong = S3Store(s3_server.bucket, endpoint=s3_server.endpoint, access_key_id=s3_server.key,
                    secret_access_key="not-the-secret", region="us-east-1", virtual_hosted_style_request=False,
                    client_options={"allow_http": True})
    with pytest.raises(Exception, match="(?i)signature|denied|forbidden|403"):
        obstore.put(wrong, "nope", b"x")


def test_objects_outlive_a_restart_of_the_server(tmp_path):
    server = S3Server(str(tmp_path)).start()
    try:
        obstore.put(server.store(), "kept", b"before the restart")
    finally:
        server.stop()
    again = S3Server(str(tmp_path)).start()  # the same data folder, new ports
    try:
        assert bytes(obstore.get(again.store(), "kept").bytes()) == b"before the restart"
    finally:
        again.stop()


def _boto3(server):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.key,
                        aws_secret_access_key=server.secret, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}))


def test_the_server_gives_what_a_commit_without_rename_needs(s3_server):
    """What the object store's commit is designed on (issue 66), held for this server: a part sent
    with its CRC-32 is refused when the CRC is wrong; a writer's unfinished upload is listed with
    when it began, and aborting it leaves none; a conditional PUT (If-None-Match: *) creates a key
    once, so a commit record is never overwritten."""
    import base64
    import zlib

    from botocore.exceptions import ClientError
    s3, key = _boto3(s3_server), "commit-needs/step-1/rank-0"
    upload = s3.create_multipart_upload(Bucket=s3_server.bucket, Key=key, ChecksumAlgorithm="CRC32")["UploadId"]
    body = os.urandom(5 << 20)

    def crc(value: int) -> str:
        return base64.b64encode(value.to_bytes(4, "big")).decode()

    sent = s3.upload_part(Bucket=s3_server.bucket, Key=key, UploadId=upload, PartNumber=1, Body=body,
                          ChecksumCRC32=crc(zlib.crc32(body)))
    assert sent["ChecksumCRC32"] == crc(zlib.crc32(body))
    with pytest.raises(ClientError, match="BadDigest"):
        s3.upload_part(Bucket=s3_server.bucket, Key=key, UploadId=upload, PartNumber=2, Body=body,
                       ChecksumCRC32=crc(zlib.crc32(body) ^ 1))
    listed = s3.list_multipart_uploads(Bucket=s3_server.bucket, Prefix="commit-needs/").get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in listed] == [(key, upload)] and listed[0]["Initiated"]
    s3.abort_multipart_upload(Bucket=s3_server.bucket, Key=key, UploadId=upload)
    assert s3.list_multipart_uploads(Bucket=s3_server.bucket, Prefix="commit-needs/").get("Uploads", []) == []
    s3.put_object(Bucket=s3_server.bucket, Key="commit-needs/COMMIT", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        s3.put_object(Bucket=s3_server.bucket, Key="commit-needs/COMMIT", Body=b"second", IfNoneMatch="*")
    assert bytes(obstore.get(s3_server.store(), "commit-needs/COMMIT").bytes()) == b"first"
