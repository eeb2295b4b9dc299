"""Crafted files: rejected with a clear error, never executing code, never allocating unboundedly."""
from __future__ import annotations

import os
import pickle
import struct
import zipfile

import pytest
import torch

import fastckpt


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/fastckpt-pwned",))


def test_pickle_payload_is_refused_not_run(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"x": Evil(), "w": torch.zeros(2)}, path)
    if os.path.exists("/tmp/fastckpt-pwned"):
        os.unlink("/tmp/fastckpt-pwned")
    with pytest.raises(fastckpt.UnsafeCheckpointError, match="posix.system|os.system"):
        fastckpt.load(path)
    assert not os.path.exists("/tmp/fastckpt-pwned")


class Allowed:
    """A plain class a user allowlists with torch.serialization.add_safe_globals."""


def test_a_pickle_the_user_allowlisted_is_refused_again_once_the_allowlist_is_cleared():
    """scan() does not walk a small pickle it has passed before under the same allowlist: the
    memo of passed pickles is keyed by the allowlist, so clearing it refuses the same bytes."""
    from fastckpt.format.safe_unpickler import scan
    data = pickle.dumps(Allowed, protocol=2)
    with pytest.raises(fastckpt.UnsafeCheckpointError, match="Allowed"):
        scan(data, "x.pkl")
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([Allowed])
    try:
        scan(data, "x.pkl")
        scan(data, "x.pkl")  # the memo's answer
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)
    with pytest.raises(fastckpt.UnsafeCheckpointError, match="Allowed"):
        scan(data, "x.pkl")


def test_weights_only_false_is_an_explicit_opt_in(tmp_path):
    path = tmp_path / "ok.pt"
    torch.save({"x": {1, 2}, "w": torch.ones(1)}, path)
    assert fastckpt.load(path)["x"] == {1, 2}


def _zip_with(tmp_path, name: str, members: dict[str, bytes]) -> str:
    path = str(tmp_path / name)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for k, v in members.items():
            z.writestr(k, v)
    return path


def test_huge_declared_sizes_are_rejected_before_allocation(tmp_path):
    path = _zip_with(tmp_path, "big.pt", {"archive/data.pkl": pickle.dumps({}), "archive/data/0": b"x" * 10})
    data = bytearray(open(path, "rb").read())
    cd = data.rfind(b"PK\x01\x02", 0, len(data))
    # claim the last record holds 2**40 bytes, in the central directory and its local header
    struct.pack_into("<II", data, cd + 20, 0xFFFFFFF0, 0xFFFFFFF0)
    open(path, "wb").write(data)
    with pytest.raises(fastckpt.CorruptCheckpointError):
        fastckpt.load(path)


def test_not_a_zip_and_garbage(tmp_path):
    p = tmp_path / "g.pt"
    p.write_bytes(os.urandom(5000))
    with pytest.raises(fastckpt.CorruptCheckpointError):
        fastckpt.load(p)
    p.write_bytes(b"")
    with pytest.raises(fastckpt.CorruptCheckpointError):
        fastckpt.load(p)


def test_compressed_records_are_refused(tmp_path):
    path = str(tmp_path / "c.pt")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"a": 1}))
    with pytest.raises(fastckpt.CorruptCheckpointError, match="compressed"):
        fastckpt.load(path)


def test_storage_size_mismatch(tmp_path):
    path = tmp_path / "s.pt"
    torch.save({"w": torch.zeros(100)}, path)
    raw = bytearray(open(path, "rb").read())
    # rewrite the pickled numel 100 -> 10000 (a storage claiming more than its record holds)
    i = raw.find(b"K\x64")  # BININT1 100
    assert i > 0
    raw[i:i + 2] = b"M\x10\x27"[:2]
    open(path, "wb").write(raw)
    with pytest.raises((fastckpt.CorruptCheckpointError, fastckpt.UnsafeCheckpointError, RuntimeError)):
        fastckpt.load(path, verify=False)


@pytest.mark.parametrize("header", [b"not json at all", b'{"w": {"dtype": "F32", "shape": [1000000000], "data_offsets": [0, 4000000000]}}',
                                    b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', b"[1,2,3]"])
def test_hostile_safetensors_headers(tmp_path, header):
    p = tmp_path / "h.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(fastckpt.CorruptCheckpointError):
        fastckpt.load(p)


def test_safetensors_header_length_past_eof(tmp_path):
    p = tmp_path / "h.safetensors"
    p.write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    with pytest.raises(fastckpt.CorruptCheckpointError, match="does not fit"):
        fastckpt.load(p)


def test_a_flipped_bit_in_a_file_torch_save_wrote_is_refused(tmp_path):
    """torch.save's own archive has no whole-file CRC (fastckpt's files do): a flipped data bit
    there is caught by the record's CRC-32 alone, and must be."""
    import zipfile
    path = tmp_path / "t.pt"
    torch.save({"w": torch.arange(4096, dtype=torch.float32)}, path)
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("/data/0"))
    raw = bytearray(path.read_bytes())
    name_len, extra_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    data_at = info.header_offset + 30 + name_len + extra_len
    raw[data_at + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(fastckpt.CorruptCheckpointError, match="CRC-32"):
        fastckpt.load(path)
