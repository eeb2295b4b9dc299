"""The version is said in one place (fastckpt.__version__): the package metadata reads it from
there, and the CHANGELOG's newest heading names the same release."""
from __future__ import annotations

import configparser
import os
import re

import fastckpt
from support.paths import ROOT


def test_the_version_is_said_once_and_the_changelog_heads_with_it():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    assert cfg["metadata"]["version"] == "attr: fastckpt.__version__"
    head = re.search(r"^## (\d+\.\d+(?:\.\d+)?)", open(os.path.join(ROOT, "CHANGELOG.md")).read(), re.M)
    release = re.match(r"\d+\.\d+(?:\.\d+)?", fastckpt.__version__).group(0)
    assert head and (release == head.group(1) or release == head.group(1) + ".0"), (fastckpt.__version__, head)


def test_the_installed_metadata_says_the_same_version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        installed = version("fastckpt")
    except PackageNotFoundError:  # run from a checkout that was never installed: nothing to compare
        return
    assert installed == fastckpt.__version__
