"""The served OpenAPI description holds against the server: Schemathesis,
with a fixed seed and a small budget of examples, on two real servers on
the fixture, one without an API key and one with
(scripts/schemathesis_run.py; docs/design/openapi.md)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_operation_conforms_with_and_without_a_key(capsys):
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts/schemathesis_run.py")],
        capture_output=True, text=True,
    )
    # The per-configuration lines (cases generated, time) go to the log.
    with capsys.disabled():
        sys.stdout.write("\n" + p.stdout)
    assert p.returncode == 0, p.stdout + p.stderr[-20000:]
    assert p.stdout.count("passed,") == 2, p.stdout
