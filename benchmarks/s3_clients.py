"""Which S3 client the object store is built on (issue 66: "pick it by measuring"): one multipart
upload of the same bytes to the same local S3 server (SeaweedFS's `weed mini`, started here as the
tests start it), by each client at each concurrency, with where the CPU went.

    python benchmarks/s3_clients.py [--mb 512] [--runs 3] [--part-mb 64] [--no-publish]

Contenders: obstore's `put` (Rust's object_store under Python: parts of a buffer uploaded in
parallel, the buffer taken without a copy) and boto3 (its `upload_part` calls on a thread pool,
one part per staging chunk, as a writer of ours would make them; botocore needs each part as bytes:
a copy). Times are medians of --runs; CPU seconds are this process's (the client) and the server's
(from /proc), over the same upload. On loopback the server shares the cores: its CPU is part of the
bound. Prints a table, writes JSON under --out and its section of benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the tests' S3 server
sys.path.insert(0, HERE)

from helpers import results  # noqa: E402
from support.s3_server import S3Server  # noqa: E402


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of a process and its finished children, from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def obstore_put(server: S3Server, data: memoryview, part: int, conc: int) -> None:
    import obstore
    obstore.put(server.store(), "bench/obstore", data, chunk_size=part, max_concurrency=conc)


def boto3_parts(server: S3Server, data: memoryview, part: int, conc: int) -> None:
    import boto3
    from botocore.config import Config
    s3 = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.key,
                      aws_secret_access_key=server.secret, region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}, max_pool_connections=conc))
    key = "bench/boto3"
    upload = s3.create_multipart_upload(Bucket=server.bucket, Key=key)["UploadId"]

    def one(i: int) -> dict:
        body = data[i * part:(i + 1) * part].tobytes()
        return {"PartNumber": i + 1, "ETag": s3.upload_part(Bucket=server.bucket, Key=key, UploadId=upload,
                                                            PartNumber=i + 1, Body=body)["ETag"]}

    with ThreadPoolExecutor(conc) as pool:
        parts = list(pool.map(one, range(-(-len(data) // part))))
    s3.complete_multipart_upload(Bucket=server.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})


CONTENDERS = {"obstore put": obstore_put, "boto3 upload_part x N threads": boto3_parts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--part-mb", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-publish", action="store_true")
    a = ap.parse_args()
    data = memoryview(os.urandom(a.mb << 20))
    part = a.part_mb << 20
    rows = []
    with tempfile.TemporaryDirectory(prefix="s3-bench-") as folder:
        server = S3Server(folder).start()
        try:
            for name, fn in CONTENDERS.items():
                fn(server, data[:part], part, 1)  # warmed up: connections, the server's volumes
                for conc in a.concurrency:
                    times, client, served = [], [], []
                    for _ in range(a.runs):
                        c0, s0, t0 = own_cpu(), cpu_of(server.proc.pid), time.perf_counter()
                        fn(server, data, part, conc)
                        times.append(time.perf_counter() - t0)
                        client.append(own_cpu() - c0)
                        served.append(cpu_of(server.proc.pid) - s0)
                    row = {"client": name, "concurrency": conc, "seconds": statistics.median(times),
                           "runs": times, "client_cpu_s": statistics.median(client),
                           "server_cpu_s": statistics.median(served)}
                    rows.append(row)
                    print(f"{name:<30} conc {conc}: {row['seconds']:.3f} s ({len(data) / row['seconds'] / 1e9:.2f} GB/s), "
                          f"client CPU {row['client_cpu_s']:.2f} s, server CPU {row['server_cpu_s']:.2f} s", flush=True)
        finally:
            server.stop()
    res = {"bytes": len(data), "part_bytes": part, "runs": a.runs, "cores": os.cpu_count(), "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "s3_clients.json"), "w") as f:
        json.dump(res, f, indent=1)
    best = min(rows, key=lambda r: r["seconds"])
    lines = [f"## s3_clients.py — {time.strftime('%Y-%m-%d %H:%M')}, vm ({os.cpu_count()} cores), SeaweedFS "
             f"`weed mini` on loopback, `python benchmarks/s3_clients.py --mb {a.mb} --runs {a.runs}`", "",
             f"One multipart upload of {a.mb} MiB in {a.part_mb} MiB parts; medians of {a.runs} runs; CPU seconds "
             "of the client (this process) and of the server over the same upload.", "",
             "| client | concurrency | seconds | GB/s | client CPU (s) | server CPU (s) | vs the fastest |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['client']} | {r['concurrency']} | {r['seconds']:.3f} | {len(data) / r['seconds'] / 1e9:.2f} "
                     f"| {r['client_cpu_s']:.2f} | {r['server_cpu_s']:.2f} | {r['seconds'] / best['seconds']:.2f}x |")
    by_client = {r["client"]: r for r in sorted(rows, key=lambda r: -r["seconds"])}  # each client's fastest
    frugal = min(by_client.values(), key=lambda r: r["client_cpu_s"])
    others = [r for r in by_client.values() if r is not frugal]
    lines += ["", f"During the fastest upload the server used {best['server_cpu_s'] / best['seconds']:.1f} of the "
              f"{os.cpu_count()} cores: on loopback it is the bound. {frugal['client']} used "
              + ", ".join(f"{o['client_cpu_s'] / frugal['client_cpu_s']:.1f}x less client CPU than {o['client']}"
                          for o in others) + " (each at its fastest concurrency)."]
    text = "\n".join(lines)
    if not a.no_publish:
        results.write_section("s3_clients", text)


if __name__ == "__main__":
    main()
