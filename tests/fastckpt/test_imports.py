"""The package's import graph, read from the sources: no import loop anywhere in the packages,
no module taking another's private names, the backend imports no framework, the plugins
(Lightning, DeepSpeed, torchtitan) never import each other — neither by an import statement nor at run time (importlib.import_module,
__import__, importlib.util.find_spec, sys.modules lookups: a module named by a string, or by a
value the reader cannot see, counts as reaching for a framework).

Module-level and function-level imports both count (a loop broken only by a deferred import
is still a loop in the design).
"""
from __future__ import annotations

import ast
import os

from support.paths import ROOT
PACKAGES = ("fastckpt", "lightning_fastckpt", "deepspeed_fastckpt", "torchtitan_fastckpt")


def _module_of(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def _bound_names(path: str) -> set[str]:
    """The names a package's __init__ binds at its top level (imported, assigned, defined)."""
    names: set[str] = set()
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (a package counts as its __init__)."""
    files = {}
    for pkg in PACKAGES:
        for d, _, names in os.walk(os.path.join(ROOT, pkg)):
            for n in names:
                if n.endswith(".py"):
                    files[_module_of(os.path.join(d, n))] = os.path.join(d, n)
    graph: dict[str, set[str]] = {m: set() for m in files}
    bound = {m: _bound_names(path) for m, path in files.items() if path.endswith("__init__.py")}
    for mod, path in files.items():
        is_pkg = path.endswith("__init__.py")
        for node in ast.walk(ast.parse(open(path).read())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = mod if is_pkg else mod.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                prefix = ".".join(p for p in ((base if node.level else ""), node.module or "") if p)
                for a in node.names:  # a submodule, or a name defined in the module `prefix` (which
                    # Python looks up first: a package's function named as its submodule is the function)
                    sub = f"{prefix}.{a.name}" in files and a.name not in bound.get(prefix, ())
                    targets.append(f"{prefix}.{a.name}" if sub else prefix)
            for t in targets:
                while t and t not in files:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                # a parent package is imported implicitly before any of its modules: not an edge
                if t and t != mod and not mod.startswith(t + "."):
                    graph[mod].add(t)
    return graph


def cycles_through(graph: dict[str, set[str]], prefix: str) -> list[list[str]]:
    """Import cycles that contain a module under `prefix`."""
    found = []
    for start in sorted(m for m in graph if m.startswith(prefix)):
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    found.append(path)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return found


def test_no_import_loop_anywhere_in_the_packages():
    graph = import_graph()
    assert "fastckpt.write.select" in graph and "deepspeed_fastckpt.interval" in graph
    loops = cycles_through(graph, "")
    assert not loops, "import loops: " + "; ".join(" -> ".join(c) for c in loops[:5])


def test_cycles_through_finds_a_loop_broken_only_by_a_deferred_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles_through(graph, "") and not cycles_through({"a": {"b"}, "b": set()}, "")


# The backend's rooms (a folder or a top-level module of fastckpt), floor by floor from the ground
# up: a room imports only rooms on lower floors. fastckpt/__init__.py is the package's face.
LAYERS = (
    ("errors", "fsutil", "timings", "machine", "reproducibility", "preempt", "progress", "front_ends",
     "workers"),  # ground
    ("format", "commit_info"),       # the bytes on disk; what a committed checkpoint is
    ("pending", "pmem"),             # a save's handle; the pool
    ("write", "verify"),             # live tensors -> staging -> a file or a pool version
    ("commit",),                     # making a checkpoint real
    ("store", "restore"),            # where bytes live; the load side
    ("settings",),                   # every setting, checked against what the layers below offer
    ("offload",),                    # tensor offload (its own settings read the Hydra layout as settings does)
    ("checkpointer", "save_load"),   # the API
    ("named", "tune"),
    ("tools", "config"),             # config: what a Hydra config builds, above all it builds
    ("dcp", "demo"),
    ("session",),                    # the front door every plugin builds on
)


def room_of(module: str) -> str | None:
    """The backend room a module belongs to (None: the package's face or another package)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "fastckpt" and len(parts) > 1 else None


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a room to a room on the same or a higher floor, and rooms LAYERS does not place."""
    floor = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
    bad = []
    for mod, deps in sorted(graph.items()):
        here = room_of(mod)
        if here is None:
            continue
        if here not in floor and here != "_native":
            bad.append(f"{mod}: room {here} has no floor in LAYERS")
            continue
        for dep in sorted(deps):
            there = room_of(dep)
            if there is None or there == here or there == "_native":
                continue
            if there not in floor or floor[there] >= floor[here]:
                bad.append(f"{mod} -> {dep}")
    return bad


def test_every_backend_import_runs_down_the_declared_floors():
    graph = import_graph()
    assert "fastckpt.config.hydra" in graph and "fastckpt.commit_info" in graph
    bad = arrows_up(graph)
    assert not bad, "imports that run back up: " + "; ".join(bad)


def test_each_import_that_once_ran_back_up_is_caught():
    """The four that ran back up while the settings and the Hydra builder shared one room (config)
    and a Pending's CommitInfo lived in commit.record, written in today's names: each alone, added
    to today's graph, fails the layer test that today's graph passes."""
    once = (("fastckpt.settings", "fastckpt.checkpointer"), ("fastckpt.settings", "fastckpt.tune.auto_interval"),
            ("fastckpt.offload.settings", "fastckpt.config"), ("fastckpt.pending", "fastckpt.commit.record"))
    today = import_graph()
    assert not arrows_up(today)
    for mod, dep in once:
        graph = {m: set(deps) for m, deps in today.items()}
        graph[mod].add(dep)
        assert arrows_up(graph) == [f"{mod} -> {dep}"]


def test_no_module_imports_another_modules_private_names():
    for pkg in PACKAGES:
        for d, _, names in os.walk(os.path.join(ROOT, pkg)):
            for n in (n for n in names if n.endswith(".py")):
                for node in ast.walk(ast.parse(open(os.path.join(d, n)).read())):
                    if isinstance(node, ast.ImportFrom):
                        private = [a.name for a in node.names if a.name.startswith("_") and a.name != "_native"
                                   and not a.name.startswith("__")]
                        assert not private, f"{os.path.join(d, n)} imports {private} from {node.module}"


def test_the_write_path_imports_no_store_no_checkpointer_and_no_framework():
    graph = import_graph()
    for mod, deps in graph.items():
        if mod.startswith("fastckpt.write"):
            bad = {d for d in deps if d.startswith(("fastckpt.store", "fastckpt.checkpointer", "fastckpt.pmem",
                                                    "lightning_fastckpt", "deepspeed_fastckpt"))}
            assert not bad, f"{mod} imports {sorted(bad)}"


def test_backend_and_plugins_keep_their_boundaries():
    for pkg, banned in (("fastckpt", ("lightning", "deepspeed", "torchtitan", "lightning_fastckpt", "deepspeed_fastckpt",
                                      "torchtitan_fastckpt")),
                        ("lightning_fastckpt", ("deepspeed", "deepspeed_fastckpt", "torchtitan_fastckpt")),
                        ("deepspeed_fastckpt", ("lightning", "pytorch_lightning", "lightning_fastckpt",
                                                "torchtitan_fastckpt")),
                        ("torchtitan_fastckpt", ("lightning", "pytorch_lightning", "deepspeed", "lightning_fastckpt",
                                                 "deepspeed_fastckpt"))):
        for d, _, names in os.walk(os.path.join(ROOT, pkg)):
            for n in (n for n in names if n.endswith(".py")):
                tree = ast.parse(open(os.path.join(d, n)).read())
                for node in ast.walk(tree):
                    mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                        [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
                    for m in mods:
                        assert m.split(".")[0] not in banned, f"{os.path.join(d, n)} imports {m}"


def test_native_features_say_only_what_this_build_has():
    """features() used to report io_uring False and fallocate True as constants (nothing uses
    io_uring; fallocate is not optional): every key now reflects the build or the machine."""
    from fastckpt import _native
    feats = dict(_native.features())
    assert set(feats) == {"o_direct", "libpmem2", "pmem_flush", "crc32", "hardware_threads"}
    assert feats["hardware_threads"] == os.cpu_count() or feats["hardware_threads"] > 0


BANNED = {"fastckpt": ("lightning", "pytorch_lightning", "deepspeed", "torchtitan", "lightning_fastckpt",
                       "deepspeed_fastckpt", "torchtitan_fastckpt"),
          "lightning_fastckpt": ("deepspeed", "deepspeed_fastckpt", "torchtitan_fastckpt"),
          "deepspeed_fastckpt": ("lightning", "pytorch_lightning", "lightning_fastckpt", "torchtitan_fastckpt"),
          "torchtitan_fastckpt": ("lightning", "pytorch_lightning", "deepspeed", "lightning_fastckpt",
                                  "deepspeed_fastckpt")}
DYNAMIC = ("import_module", "__import__", "find_spec", "find_loader", "load_module")


def runtime_reaches(source: str, banned: tuple[str, ...]) -> list[str]:
    """What a module's source reaches at run time without an import statement: a call of
    importlib.import_module / __import__ / find_spec, or a sys.modules lookup, naming a banned
    package — or naming a module by a value that is not a literal (which could be anything)."""
    found = []

    def judge(node, arg) -> None:
        where = f"line {node.lineno}"
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if arg.value.split(".")[0] in banned:
                found.append(f"{where}: {arg.value!r}")
        else:
            found.append(f"{where}: a module named at run time ({ast.unparse(arg)})")

    def is_sys_modules(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "modules" and \
            isinstance(node.value, ast.Name) and node.value.id == "sys"

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in DYNAMIC and node.args:
                judge(node, node.args[0])
            elif isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and is_sys_modules(f.value) \
                    and node.args:
                judge(node, node.args[0])
        elif isinstance(node, ast.Subscript) and is_sys_modules(node.value):
            judge(node, node.slice)
        elif isinstance(node, ast.Compare) and any(is_sys_modules(c) for c in node.comparators):
            judge(node, node.left)  # "deepspeed" in sys.modules
    return found


def test_no_package_reaches_a_framework_it_may_not_import_at_run_time():
    for pkg, banned in BANNED.items():
        for d, _, names in os.walk(os.path.join(ROOT, pkg)):
            for n in (n for n in names if n.endswith(".py")):
                path = os.path.join(d, n)
                reached = runtime_reaches(open(path).read(), banned)
                assert not reached, f"{os.path.relpath(path, ROOT)} reaches at run time: {reached}"


def test_a_framework_reached_through_importlib_or_sys_modules_is_caught():
    """Planted: each way the old fastckpt/store/deepspeed_types.py (importlib over a tuple of
    names) and the old deepspeed_fastckpt/lightning_removal.py (sys.modules) reached a framework."""
    banned = BANNED["fastckpt"]
    planted = {
        "import importlib\nm = importlib.import_module('deepspeed.runtime.zero.config')": "'deepspeed.runtime",
        "from importlib import import_module\nfor mod in NAMES:\n    import_module(mod)": "named at run time",
        "ds = __import__('deepspeed')": "'deepspeed'",
        "import sys\nm = sys.modules.get('lightning.pytorch.strategies.deepspeed')": "'lightning.pytorch",
        "import sys\nm = sys.modules['pytorch_lightning']": "'pytorch_lightning'",
        "import sys\nif 'deepspeed' in sys.modules: pass": "'deepspeed'",
        "import importlib.util\nimportlib.util.find_spec('lightning_fastckpt')": "'lightning_fastckpt'",
    }
    for source, said in planted.items():
        reached = runtime_reaches(source, banned)
        assert reached and said in reached[0], (source, reached)
    # a plugin reaching the other's framework (the DeepSpeed plugin wrapping Lightning's strategy)
    reached = runtime_reaches("import sys\nm = sys.modules.get('lightning.pytorch.strategies.deepspeed')",
                              BANNED["deepspeed_fastckpt"])
    assert reached and "'lightning.pytorch" in reached[0], reached
    assert runtime_reaches("import importlib\nimportlib.import_module('json')", banned) == []
    assert runtime_reaches("from importlib.metadata import entry_points", banned) == []


# What each plugin reaches of the backend, module by module: the front door (fastckpt.session),
# the errors and, for DCP, fastckpt.dcp, nothing deeper. A plugin that reaches one module more
# fails here, and one that reaches fewer says so.
REACH = {
    "lightning_fastckpt": {"fastckpt.dcp", "fastckpt.errors", "fastckpt.session"},
    "deepspeed_fastckpt": {"fastckpt.errors", "fastckpt.session"},
    "torchtitan_fastckpt": {"fastckpt.dcp", "fastckpt.session"},
}


def test_each_plugin_reaches_the_backend_modules_listed_and_no_more():
    graph = import_graph()
    for plugin, listed in REACH.items():
        reached = {d for m, deps in graph.items() if m.split(".")[0] == plugin
                   for d in deps if d.split(".")[0] == "fastckpt"}
        assert reached <= listed, f"{plugin} reaches further into the backend: {sorted(reached - listed)}"
        assert len(listed) <= 3
        assert reached == listed, f"{plugin} no longer reaches {sorted(listed - reached)}: take them off REACH"
