"""Part 5: hostile files — checkpoints whose structure is crafted rather than damaged: pickle
payloads that would run code, huge declared lengths, overlapping records, non-JSON and
pathologically nested headers, memo and length bombs, commit records that point outside
their directory or are not regular files.

Each case is loaded by a forked child under an address-space limit (its size at fork + 1 GiB)
and a time limit: files by fastckpt.load (mapped, and copied with mmap=False), roots by
Checkpointer.load. It passes when every load refuses it with one of fastckpt's errors
(CorruptCheckpointError, UnsafeCheckpointError, NoCheckpointError), `fastckpt verify` flags
it (except an intact file whose only fault is a global off the allowlist: verify checks
integrity and names it UNSAFE), the payload's marker file was never created, and nothing was
killed, timed out or ran out of memory.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
import zlib

import forked

ALLOWED = {"CorruptCheckpointError", "UnsafeCheckpointError", "NoCheckpointError"}


class _Payload:
    """Pickles as a call of `fn(*args)` — what a malicious checkpoint carries."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _torch_members(state) -> dict[str, bytes]:
    import torch
    buf = io.BytesIO()
    torch.save(state, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return {n: z.read(n) for n in z.namelist()}


def _write_zip(path: str, members: dict[str, bytes], compress: bool = False) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as z:
        for n, b in members.items():
            z.writestr(n, b)


def _with_pkl(members: dict, pkl: bytes) -> dict:
    out = dict(members)
    out[next(n for n in out if n.endswith("data.pkl"))] = pkl
    return out


def _protocol2(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)


def _write_st(path: str, header, data: bytes = b"", raw_header: bytes | None = None) -> None:
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def _patch(path: str, off: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


def _eocd(raw: bytes) -> int:
    return raw.rindex(b"PK\x05\x06")


def _set_view(skel: dict, **geometry) -> None:
    """Edits the one view reference ({"storage": ...}) of a skeleton in place."""
    def walk(node):
        if isinstance(node, dict):
            if "storage" in node and "offset" in node:
                node.update(geometry)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(skel)


def _resign_st(src: str, dst: str, edit) -> None:
    """A copy of a fastckpt safetensors file with its skeleton edited and its header CRC
    recomputed, so that only the structural checks stand between it and a load."""
    from fastckpt.format.safetensors_format import CRC_KEY, SKELETON_KEY
    raw = open(src, "rb").read()
    (hlen,) = struct.unpack_from("<Q", raw)
    header, data = json.loads(raw[8:8 + hlen]), raw[8 + hlen:]
    skel = json.loads(header["__metadata__"][SKELETON_KEY])
    edit(skel)
    header["__metadata__"][SKELETON_KEY] = json.dumps(skel, separators=(",", ":"))
    header["__metadata__"][CRC_KEY] = "0" * 8
    body = json.dumps(header, separators=(",", ":")).encode()
    head = struct.pack("<Q", len(body)) + body
    signed = head.replace(f'"{CRC_KEY}":"00000000"'.encode(), f'"{CRC_KEY}":"{zlib.crc32(head):08x}"'.encode())
    with open(dst, "wb") as out:
        out.write(signed + data)


def build(work: str, marker: str) -> list[tuple[str, str, str]]:
    """Writes every case under work; returns (name, kind: file|root, path)."""
    import torch

    import fastckpt
    os.makedirs(work, exist_ok=True)
    cases: list[tuple[str, str, str]] = []

    def f(name: str) -> str:
        p = os.path.join(work, name)
        cases.append((name, "file", p))
        return p

    good = {"w": torch.arange(16, dtype=torch.float32), "n": 3}
    members = _torch_members(good)
    touch = f"open({marker!r}, 'w').close()"
    # -- pickle payloads -----------------------------------------------------
    _write_zip(f("pickle_os_system.pt"), _with_pkl(members, _protocol2(_Payload(os.system, f"touch {marker}"))))
    _write_zip(f("pickle_builtins_exec.pt"), _with_pkl(members, _protocol2(_Payload(exec, touch))))
    _write_zip(f("pickle_builtins_eval.pt"), _with_pkl(members, _protocol2(_Payload(eval, touch))))
    import subprocess
    _write_zip(f("pickle_subprocess.pt"), _with_pkl(members, _protocol2(_Payload(subprocess.call, ["touch", marker]))))
    _write_zip(f("pickle_getattr_chain.pt"), _with_pkl(  # getattr(__import__("os"), "system")
        members, b"\x80\x02cbuiltins\ngetattr\ncbuiltins\n__import__\nX\x02\x00\x00\x00os\x85RX\x06\x00\x00\x00system\x86R."))
    _write_zip(f("pickle_codecs_zlib.pt"), _with_pkl(members, b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x04\x00\x00\x00zlib\x86R."))
    _write_zip(f("pickle_torch_load_nested.pt"), _with_pkl(members, b"\x80\x02ctorch\nload\nX\x05\x00\x00\x00/etc/\x85R."))
    # -- pickle bombs and lies ------------------------------------------------
    _write_zip(f("pickle_memo_bomb.pt"), _with_pkl(members, b"\x80\x02]r\xff\xff\xff\x7f."))  # LONG_BINPUT 2^31-1
    _write_zip(f("pickle_binbytes8_huge.pt"), _with_pkl(members, b"\x80\x04\x8e" + struct.pack("<Q", 1 << 60) + b"x."))
    _write_zip(f("pickle_deep_nesting.pt"), _with_pkl(members, b"\x80\x02" + b"(" * 200_000 + b"l" * 200_000 + b"."))
    _write_zip(f("pickle_truncated.pt"), _with_pkl(members, members[next(n for n in members if n.endswith("data.pkl"))][:-7]))
    _write_zip(f("pickle_unknown_persistent_id.pt"), _with_pkl(members, b"\x80\x02X\x03\x00\x00\x00abcQ."))
    class _Pid:
        def __init__(self, pid):
            self.pid = pid

    class _P(pickle.Pickler):
        def persistent_id(self, obj):
            return obj.pid if isinstance(obj, _Pid) else None

    def pkl_with(obj) -> bytes:
        b = io.BytesIO()
        _P(b, protocol=2).dump(obj)
        return b.getvalue()

    storage = _Pid(("storage", torch.FloatStorage, "0", "cpu", 16))
    _write_zip(f("tensor_view_out_of_bounds.pt"), _with_pkl(members, pkl_with(
        _Payload(torch._utils._rebuild_tensor_v2, storage, 10, (1 << 40,), (1,), False, {}))))
    _write_zip(f("tensor_negative_stride.pt"), _with_pkl(members, pkl_with(
        _Payload(torch._utils._rebuild_tensor_v2, storage, 0, (16,), (-1,), False, {}))))
    _write_zip(f("storage_numel_huge.pt"), _with_pkl(members, pkl_with(
        _Payload(torch._utils._rebuild_tensor_v2, _Pid(("storage", torch.FloatStorage, "0", "cpu", 1 << 50)),
                 0, (16,), (1,), False, {}))))
    _write_zip(f("storage_missing_record.pt"), _with_pkl(members, pkl_with(
        _Payload(torch._utils._rebuild_tensor_v2, _Pid(("storage", torch.FloatStorage, "77", "cpu", 16)),
                 0, (16,), (1,), False, {}))))
    # -- zip structure ----------------------------------------------------------
    _write_zip(f("zip_compressed.pt"), members, compress=True)
    _write_zip(f("zip_no_data_pkl.pt"), {n: b for n, b in members.items() if not n.endswith("data.pkl")})
    _write_zip(f("zip_path_traversal_names.pt"), {n.replace("archive/", "../../"): b for n, b in members.items()})
    p = f("zip_overlapping_records.pt")
    fastckpt.save(good, p)
    raw = open(p, "rb").read()
    cd = raw.index(b"PK\x01\x02")
    second = raw.index(b"PK\x01\x02", cd + 4)
    _patch(p, second + 42, raw[cd + 42:cd + 46])  # the second entry's header offset := the first's
    p = f("zip_huge_declared_size.pt")
    fastckpt.save(good, p)
    raw = open(p, "rb").read()
    cd = raw.index(b"PK\x01\x02")
    _patch(p, cd + 20, struct.pack("<II", 0x7FFFFFF0, 0x7FFFFFF0))
    p = f("zip_cd_offset_past_eof.pt")
    fastckpt.save(good, p)
    raw = open(p, "rb").read()
    _patch(p, _eocd(raw) + 16, struct.pack("<I", 0x7FFFFFFF))
    p = f("zip_entry_count_bomb.pt")
    fastckpt.save(good, p)
    raw = open(p, "rb").read()
    _patch(p, _eocd(raw) + 8, struct.pack("<HH", 0xFFFE, 0xFFFE))
    with open(f("zip_truncated.pt"), "wb") as out:
        out.write(raw[: len(raw) // 2])
    with open(f("not_a_checkpoint.pt"), "wb") as out:
        out.write(b"PK\x03\x04" + os.urandom(4096))
    open(f("empty.pt"), "wb").close()
    # -- safetensors headers ------------------------------------------------
    with open(f("st_length_huge.safetensors"), "wb") as out:
        out.write(struct.pack("<Q", (1 << 63) + 5) + b"{}")
    _write_st(f("st_not_json.safetensors"), None, raw_header=b"{ this is not json }")
    _write_st(f("st_deep_nesting.safetensors"), None, raw_header=b"{\"a\":" + b"[" * 100_000 + b"]" * 100_000 + b"}")
    _write_st(f("st_header_is_a_list.safetensors"), None, raw_header=b"[1, 2, 3]")
    _write_st(f("st_overlapping_offsets.safetensors"), {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                                        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, bytes(24))
    _write_st(f("st_offsets_past_eof.safetensors"), {"a": {"dtype": "F32", "shape": [1 << 30], "data_offsets": [0, 4 << 30]}}, bytes(16))
    _write_st(f("st_reversed_offsets.safetensors"), {"a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}}, bytes(16))
    _write_st(f("st_shape_mismatch.safetensors"), {"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}, bytes(16))
    _write_st(f("st_shape_overflow.safetensors"), {"a": {"dtype": "F32", "shape": [1 << 62, 1 << 62, 4], "data_offsets": [0, 16]}}, bytes(16))
    _write_st(f("st_negative_shape.safetensors"), {"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, bytes(16))
    _write_st(f("st_unknown_dtype.safetensors"), {"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, bytes(16))
    _write_st(f("st_metadata_not_strings.safetensors"), {"__metadata__": {"x": [1, 2]}, "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(16))
    _write_st(f("st_huge_number.safetensors"), {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1e400]}}, bytes(16))
    base_t = torch.arange(64, dtype=torch.float32)
    src = os.path.join(work, "st-source.safetensors")
    fastckpt.save({"base": base_t, "view": base_t[8:16]}, src, format="safetensors")
    _resign_st(src, f("st_skeleton_view_out_of_bounds.safetensors"),
               lambda skel: _set_view(skel, offset=1 << 40))
    _resign_st(src, f("st_skeleton_negative_stride.safetensors"),
               lambda skel: _set_view(skel, stride=[-1]))
    evil = __import__("base64").b64encode(_protocol2(_Payload(os.system, f"touch {marker}"))).decode()
    _resign_st(src, f("st_skeleton_pickle_payload.safetensors"),
               lambda skel: skel.update({"$d": skel["$d"] + [["x", {"$pickle": evil}]]}))
    # -- commit records of a root -----------------------------------------------
    base = os.path.join(work, "root-base")
    with fastckpt.Checkpointer(base, keep=1) as ck:
        ck.save(good, step=1).wait()
    ckdir = next(os.path.join(base, d) for d in os.listdir(base) if d.startswith("step-"))
    rec = json.loads(open(os.path.join(ckdir, "COMMIT"), "rb").read())

    def root_with(name: str, body_edit=None, commit_bytes: bytes | None = None, special=None) -> None:
        import shutil
        r = os.path.join(work, name)
        shutil.copytree(base, r)
        d = os.path.join(r, os.path.basename(ckdir))
        cpath = os.path.join(d, "COMMIT")
        if body_edit is not None:
            body = json.loads(json.dumps(rec["body"]))
            body_edit(body, d)
            canon = json.dumps(body, sort_keys=True, separators=(",", ":"))
            commit_bytes = json.dumps({"crc32": zlib.crc32(canon.encode()), "body": body}).encode()
        if commit_bytes is not None:
            with open(cpath, "wb") as out:
                out.write(commit_bytes)
        if special is not None:
            special(cpath, d)
        cases.append((name, "root", r))

    def outside(body, d):
        body["files"][0]["name"] = "../outside.pt"
        import shutil
        shutil.copy(os.path.join(d, "rank-0.pt"), os.path.join(os.path.dirname(d), "outside.pt"))
        body["files"][0]["bytes"] = os.path.getsize(os.path.join(d, "rank-0.pt"))

    def absolute(body, d):
        body["files"][0]["name"] = os.path.abspath(os.path.join(d, "rank-0.pt"))

    def inf_bytes(body, d):
        body["bytes"] = 1e400

    def many_files(body, d):
        body["files"] = [dict(body["files"][0], rank=i) for i in range(200_000)]
        body["world_size"] = 200_000

    def fifo(cpath, d):
        os.unlink(cpath)
        os.mkfifo(cpath)

    def zero_link(cpath, d):
        os.unlink(cpath)
        os.symlink("/dev/zero", cpath)

    def data_fifo(cpath, d):
        os.unlink(os.path.join(d, "rank-0.pt"))
        os.mkfifo(os.path.join(d, "rank-0.pt"))

    root_with("commit_names_outside_its_dir", outside)
    root_with("commit_names_absolute_path", absolute)
    root_with("commit_infinite_number", inf_bytes)
    root_with("commit_200k_files", many_files)
    root_with("commit_70mib_of_spaces", commit_bytes=b" " * (70 << 20))
    root_with("commit_not_json", commit_bytes=b"\xff\xfe not json")
    root_with("commit_deep_nesting", commit_bytes=b"[" * 100_000 + b"]" * 100_000)
    root_with("commit_is_a_fifo", special=fifo)
    root_with("commit_links_to_dev_zero", special=zero_link)
    root_with("data_file_is_a_fifo", special=data_fifo)
    return cases


def _load(kind: str, path: str) -> str:
    """What a load answers ("LOADED" or "Type: message"), then whether `fastckpt verify` flags it."""
    import contextlib
    import warnings

    import fastckpt
    from fastckpt.tools.cli import main as cli_main
    warnings.simplefilter("ignore")
    answers = []
    loads = ([lambda: fastckpt.load(path), lambda: fastckpt.load(path, mmap=False)] if kind == "file"
             else [lambda: fastckpt.Checkpointer(path).load()])
    for load in loads:
        try:
            load()
            answers.append("LOADED")
        except Exception as e:  # noqa: BLE001 - judged by type in run()
            answers.append(type(e).__name__ + ": " + str(e)[:200])
    with contextlib.redirect_stdout(io.StringIO()):
        flagged = cli_main(["verify", path]) != 0
    return json.dumps({"answers": answers, "flagged": flagged})


def _limit() -> int:
    with open("/proc/self/status") as st:
        vm = next(int(line.split()[1]) * 1024 for line in st if line.startswith("VmSize:"))
    return vm + (1 << 30)


def run(work: str, timeout: float = 60.0) -> dict:
    marker = os.path.join(work, "PWNED")
    got = forked.call(build, os.path.join(work, "cases"), marker, timeout=300)
    if not got["ok"]:
        raise RuntimeError(f"could not build the hostile cases: {got}")
    rows, failures = {}, []
    for name, kind, path in got["result"]:
        res = forked.call(_load, kind, path, timeout=timeout, mem_limit=_limit())
        if res["ok"]:
            out = json.loads(res["result"])
            answers, flagged = out["answers"], out["flagged"]
        else:
            answers, flagged = [f"{res.get('type')}: {res.get('error', '')[:200]}"], False
        types = {a.split(":")[0] for a in answers}
        # an intact file that asks for a global is flagged by load, not by verify (which checks integrity)
        ok = (res["ok"] and types <= ALLOWED and (flagged or types == {"UnsafeCheckpointError"})
              and not os.path.exists(marker))
        rows[name] = {"rejected": ok, "answers": answers, "verify_flagged": flagged}
        if not ok:
            failures.append(f"{name}: {answers} verify_flagged={flagged}"
                            + (" (PAYLOAD RAN)" if os.path.exists(marker) else ""))
        if os.path.exists(marker):
            os.unlink(marker)
    return {"cases": len(rows), "rejected": sum(r["rejected"] for r in rows.values()),
            "code_executed": sum("PAYLOAD RAN" in x for x in failures), "by_case": rows, "failures": failures}
