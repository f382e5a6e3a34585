"""The reference step's cache (scripts/reference/cache.py): a fresh checkout
reuses every step computed before, and a changed input marks exactly the
steps that read it. Runs `--plan` on copies of the repository's scripts and
fixtures, against the cache that `make test`'s reference stage filled."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def plan(repo):
    out = subprocess.run(
        [sys.executable, str(repo / "scripts/reference/cache.py"), str(repo / "target/reference"),
         "--plan"],
        check=True, capture_output=True, text=True, env=os.environ)
    return {line.split()[0]: line.split()[1] == "cached" for line in out.stdout.splitlines()}


def test_a_changed_input_recomputes_exactly_what_reads_it(tmp_path):
    repo = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    shutil.copytree(ROOT / "tests/fixtures/bases", repo / "tests/fixtures/bases")
    before = plan(repo)
    assert len(before) >= 10, before
    assert all(before.values()), f"another checkout's steps are not reused: {before}"

    config = repo / "tests/fixtures/bases/gemma-4-12B-it-6bit.config.json"
    c = json.loads(config.read_text())
    c["_changed"] = True
    config.write_text(json.dumps(c))
    with open(repo / "scripts/reference/prompts.py", "a") as f:
        f.write("\n# changed\n")
    after = plan(repo)
    assert {k for k, cached in after.items() if not cached} == {"tiny-gemma4_12b", "prompts"}, after


def test_a_test_client_pinned_beside_the_reference_changes_no_step(tmp_path):
    repo = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    shutil.copytree(ROOT / "tests/fixtures/bases", repo / "tests/fixtures/bases")
    requirements = repo / "scripts/requirements.txt"
    with open(requirements, "a") as f:
        f.write("\nsome-test-client==1.0\n")
    assert all(plan(repo).values()), "a pin the reference does not read recomputed a step"
    # A reference package's pin does change every step.
    text = requirements.read_text().replace("numpy==", "numpy==0.0.0+")
    requirements.write_text(text)
    assert not any(plan(repo).values())
