"""The campaign's figures in words: one line (or a few) per part, as RESULTS.md records them.

Pure functions of a part's result dict; tests/campaign/run.py prints them as it goes, and
benchmarks/reliability.py records them (it loads this file by its path).
"""
from __future__ import annotations

PARTS = ("kills", "corruptions", "faults", "ranks", "hostile", "soak")


def _outcome(row: dict) -> str:
    if row["stopped"]:
        return "stopped: " + row["stopped"][len("stopped "):][:90] + "…"
    return f"trained every step, {row['warned']} warnings"


def summary(part: str, r: dict) -> str:
    if "skipped" in r:
        return f"- **{part}**: skipped — {r['skipped']}"
    if part == "kills":
        head = (f"{r['kills']} kill -9, **{r['unrecoverable']} unrecoverable**, {r['before_first_commit']} before "
                f"any commit; every recovery loaded at a step >= the last reported commit, bit-exact")
        rows = "".join(f"\n  - {k}: {v['kills']} kills, {v['recovered']} recovered, {v['unrecoverable']} lost, "
                       f"newest at most {v['max_steps_ahead_of_report']} steps past the last report, recovery "
                       f"{(v['median_recover_s'] or 0) * 1000:.0f} ms median" for k, v in r["by_store"].items())
        return f"- **kills**: {head}{rows}"
    if part == "corruptions":
        kinds = {}
        for k, v in r["by_kind"].items():
            kind = k.split(" ", 1)[1]
            a = kinds.setdefault(kind, [0, 0])
            a[0] += v["detected"]
            a[1] += v["trials"]
        rows = ", ".join(f"{k} {d}/{t}" for k, (d, t) in kinds.items())
        return (f"- **corruptions**: {r['corruptions']} (torch and safetensors roots), **{r['detected']} detected "
                f"({r['detected_pct']:.1f} %)** with the right fallback: {rows}")
    if part == "faults":
        rows = "".join(f"\n  - {x['fault']} / {x['mode']} / on_error={x['on_error']}: "
                       f"{'ok' if x['ok'] else 'FAILED'}, survivor step {x['survivor_step']}, "
                       f"{_outcome(x)}"
                       for x in r["rows"])
        return f"- **faults**: {r['passed']}/{r['runs']} runs as configured, nothing committed lost{rows}"
    if part == "ranks":
        rows = "; ".join(f"{k}: {v['resumed_same_step']}/{v['rounds']}" for k, v in r["by_world"].items())
        return (f"- **ranks**: {r['rounds']} rounds (one random rank killed), **{r['resumed_same_step']} resumed every "
                f"rank from the same step** (>= last reported commit, bit-exact, and saved again): {rows}")
    if part == "hostile":
        unsafe = sum(1 for v in r["by_case"].values() if not v["verify_flagged"])
        return (f"- **hostile**: {r['cases']} crafted files, **{r['rejected']} rejected** with a fastckpt error by "
                f"every load (mapped and copied); `fastckpt verify` flags {r['cases'] - unsafe} and names the "
                f"other {unsafe} (intact files whose pickle asks for a global off the allowlist) UNSAFE; payload "
                f"executed {r['code_executed']} times; none killed, timed out or out of memory under a 1 GiB "
                f"address-space limit")
    return (f"- **soak**: {r['saves']} saves + {r.get('loads')} loads ({r.get('hours_equivalent')} h-equivalent at one "
            f"checkpoint per 10 s) in {r.get('seconds')} s: RSS {r.get('rss_mib')} MiB, fds {r.get('fds')}, "
            f"threads {r.get('threads')}, checkpoint dirs {r.get('dirs')} (after warm-up, at the end) — "
            f"{'flat' if r['ok'] else 'NOT flat: ' + '; '.join(r['problems'])}")
