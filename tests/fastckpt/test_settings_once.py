"""Settings are one object: fastckpt.settings.CheckpointerConfig spells each setting once (its field,
default, doc and check), and no other module lists their names again — no tuple of names, no
signature spelling them out, no dict built from a list of them. What counts as a list: a literal
tuple/list/set of 3 or more strings that are setting names, or a function with 4 or more
parameters named after settings. Frameworks' own typed configs are the one place a plugin may
declare them again (torchtitan's Config fields, which torchtitan's CLI reads) and are named
below. The config is frozen and checked when made, never again."""
from __future__ import annotations

import ast
import dataclasses
import os

import pytest

from fastckpt.errors import ConfigError
from fastckpt.settings import PLACEMENT, WRITING, CheckpointerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("fastckpt", "lightning_fastckpt", "deepspeed_fastckpt", "torchtitan_fastckpt")
NAMES = {f.name for f in dataclasses.fields(CheckpointerConfig)}
DEFINITION = os.path.join("fastckpt", "settings.py")
FRAMEWORK_FACES = {os.path.join("torchtitan_fastckpt", "manager.py"):
                   "torchtitan's CheckpointManager.Config declares its fields for torchtitan's CLI"}


def lists_of_setting_names(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            named = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in NAMES]
            if len(named) >= 3:
                found.append(f"line {node.lineno}: {named}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in node.args.args + node.args.kwonlyargs if a.arg in NAMES]
            if len(params) >= 4:
                found.append(f"line {node.lineno}: def {node.name}({', '.join(params)})")
    return found


def sources():
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    yield os.path.relpath(path, ROOT), path


def test_no_module_but_the_settings_lists_the_settings_names():
    offenders = {}
    for rel, path in sources():
        if rel == DEFINITION or rel in FRAMEWORK_FACES:
            continue
        with open(path) as f:
            found = lists_of_setting_names(ast.parse(f.read()))
        if found:
            offenders[rel] = found
    assert not offenders, offenders


def test_the_check_catches_a_list_of_names_and_a_signature_spelling_them():
    planted = ast.parse('KEYS = ("strategy", "concurrency", "writers")\n'
                        'def f(strategy="c", concurrency=2, writers=4, chunk_mb=64): pass\n')
    assert len(lists_of_setting_names(planted)) == 2


def test_placement_and_writing_split_the_fields_and_come_from_the_fields():
    assert set(PLACEMENT) | set(WRITING) == NAMES and not set(PLACEMENT) & set(WRITING)
    assert set(PLACEMENT) == {f.name for f in dataclasses.fields(CheckpointerConfig) if f.metadata.get("placement")}


def test_the_settings_are_frozen_and_checked_when_made():
    with pytest.raises(ConfigError, match="concurrency must be an integer >= 1"):
        CheckpointerConfig(concurrency=0)
    c = CheckpointerConfig(concurrency=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.concurrency = 0
    with pytest.raises(ConfigError, match="writers must be"):
        dataclasses.replace(c, writers=0)  # a changed copy is made, and checked as made


def test_a_setting_given_by_position_is_a_clear_error(tmp_path):
    import fastckpt
    with pytest.raises(TypeError, match="settings= takes a CheckpointerConfig.*by keyword"):
        fastckpt.Checkpointer(str(tmp_path), "c")
    with pytest.raises(ConfigError, match=r"\['keep'\] are not settings here"):
        from fastckpt.named import NamedCheckpoints
        NamedCheckpoints.by_path({"keep": 3})


def test_every_front_door_takes_its_settings_one_way_with_the_same_words(tmp_path):
    """Checkpointer, FastStager and FastStorageWriter take one CheckpointerConfig or mapping
    (settings=), or keywords, through one check (settings.given_one_way): both at once, or a
    setting by position, is the same one-line TypeError at each."""
    import fastckpt
    from fastckpt.dcp import FastStager, FastStorageWriter
    doors = {"Checkpointer": lambda s, **k: fastckpt.Checkpointer(str(tmp_path / "ck"), settings=s, **k),
             "FastStager": lambda s, **k: FastStager(s, **k),
             "FastStorageWriter": lambda s, **k: FastStorageWriter(str(tmp_path / "dcp"), settings=s, **k)}
    for name, door in doors.items():
        with pytest.raises(TypeError, match="either as one CheckpointerConfig or as keywords, not both"):
            door({"concurrency": 2}, writers=2)
        with pytest.raises(TypeError, match="settings= takes a CheckpointerConfig.*by keyword"):
            door("c")
        made = door({"concurrency": 2})  # a mapping of settings, as from a plugin's config
        assert made.config.concurrency == 2, name
        made.close()
