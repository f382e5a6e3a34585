"""The Mac benchmark (scripts/bench/mac.py) at its quick sizes on the
fixture: the record has every case for both servers with positive times,
names the device it measured, and explains the lengths it skipped. Needs
the release binary ($DECISIO_BIN, else $CARGO_TARGET_DIR or target,
release/decisio) and the fixture's dense copy (made if missing)."""

import json
import os
import pathlib
import signal
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("DECISIO_BIN") or
                   pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release/decisio")


def test_quick_run_records_every_case_and_the_device(tmp_path):
    assert BIN.exists(), f"no decisio binary at {BIN} (cargo build --release, or set DECISIO_BIN)"
    out = tmp_path / "record"
    # In its own process group, so that a run past the limit takes its
    # servers with it.
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts/bench/mac.py"), "--quick", "--bin", str(BIN),
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    record = json.loads((out / "results.json").read_text())
    summary = (out / "summary.md").read_text()

    # The device: decisio's start-up log and mlx.core's default device.
    device = record["device"]
    assert device["decisio"] and set(device["decisio"]) <= {"cpu", "gpu"}, device
    assert device["mlx_lm_default_device"].startswith("Device("), device
    assert device["platform"] and device["processor"]
    for text in (summary, stdout):
        assert device["line"] in text
        assert f"MLX computes on the {device['decisio'][0]}" in text
        assert device["mlx_lm_default_device"] in text

    reps, questions = record["args"]["reps"], record["args"]["questions"]
    assert record["models"], record
    for model in record["models"]:
        assert "error" not in model, model.get("error")
        samples = model["timing"]["samples_seconds"]
        assert set(samples) == {"a", "b", "c"}
        for case, by in samples.items():
            for server in ("decisio", "mlx_lm"):
                assert len(by[server]) == reps, (case, server, by)
                assert all(t > 0 for t in by[server]), (case, server, by)
            m = model["medians"][case]
            assert m["decisio_ms"] > 0 and m["mlx_lm_ms"] > 0 and m["ratio"] > 0
        said = model["timing"]["responses"]
        assert not any(r["cached"] for r in said["a"]["decisio"]), "a new state was found cached"
        assert all(r["cached"] for r in said["b"]["decisio"]), "a seen state was not cached"
        assert all(len(r["prompt_tokens"]) == questions for r in said["c"]["mlx_lm"])

        rows = {r["target_tokens"]: r for r in model["memory"]}
        assert sorted(rows) == record["args"]["memory_tokens"]
        measured = [r for r in rows.values() if "skipped" not in r]
        skipped = [r for r in rows.values() if "skipped" in r]
        assert measured and skipped, rows
        for r in measured:
            for server in ("decisio", "mlx_lm"):
                assert "error" not in r[server], r[server]
                assert r[server]["peak_rss_bytes"] > 0 and r[server]["mlx_peak_bytes"] > 0, r
                assert r[server]["seconds"] > 0
        for r in skipped:
            assert r["target_tokens"] > model["context"]
            assert "context" in r["skipped"] and f"{model['context']:,}" in r["skipped"], r
            assert r["skipped"] in summary

    for row in ("| (a) ", "| (b) ", "| (c) "):
        assert row in summary
    assert "RSS" in summary and "MLX peak" in summary
