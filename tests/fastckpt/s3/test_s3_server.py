"""The S3 server the object-store tests run against (issue 66): SeaweedFS from the registry,
started by the tests on loopback. It is a real server: objects written go through its volume
server and come back byte for byte, multipart uploads and ranged reads work, a request signed
with the wrong secret is refused, and its objects outlive a restart (what the tests that stop
it mid-save rely on)."""
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
