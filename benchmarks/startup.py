"""Start-up: what the first gradcells call costs in a new process, with a warm Numba cache.

    python benchmarks/startup.py                  # 9 rounds
    python benchmarks/startup.py --repeats 15 --skip torch

Each round starts one fresh Python process per contestant (rounds interleaved, so a busy
machine disturbs every contestant alike) and each process reports three times:

- ``import``: ``import numpy`` and the contestant's own imports;
- ``first call``: one float32 LSTM cell step (forward) with NumPy arrays, on the
  contestant's fastest CPU path, from the end of the imports;
- ``second call``: the same call again.

Contestants:

- ``gradcells``: ``gc.lstm_cell`` (the Numba backend: the first call imports Numba and loads
  the cached kernel);
- ``plain numba``: a trivial ``@numba.njit(cache=True)`` function, imported and called the
  same way: what a cached Numba function costs on its first call (Numba's import, its
  target's initialisation and one cache load), which gradcells undercuts by deferring
  Numba's SciPy probe (``gradcells/cpu/_compile.py``);
- ``reference``: ``gc.lstm_cell(..., backend="reference")`` (pure NumPy, no Numba);
- ``torch``: ``torch.nn.LSTMCell`` forward (``import torch`` counted as its import);
- ``gradcells sequence + grad``: ``gc.lstm_sequence`` and ``gc.lstm_sequence_grad`` at
  (T, B, I, H) = (8, 4, 32, 32), the first call docs/spec.md §17 bounds (0.3 s);
- ``torch nn.LSTM + backward``: the same with ``torch.nn.LSTM``.

``--load`` runs every round beside one busy-loop process per core (started and stopped by
the benchmark): the start-up of a loaded machine.

One unmeasured round first fills the Numba caches. The table shows medians over
``--repeats`` rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import duration, missing, table  # noqa: E402
from under_load import busy_loops  # noqa: E402

# Each program prints {"import": s, "first": s, "second": s}. They time from their own
# start, so interpreter start-up (the same for all) is left out.
_TIMER = """
import json, time
t0 = time.perf_counter()
import numpy as np
{imports}
t1 = time.perf_counter()
x = np.ones((4, 32), np.float32); h = np.ones((4, 32), np.float32)
w = np.ones((64, 128), np.float32); b = np.ones(128, np.float32)
xs = np.ones((8, 4, 32), np.float32)
{call}
t2 = time.perf_counter()
{call}
t3 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "first": t2 - t1, "second": t3 - t2}}))
"""

_NUMBA_FLOOR = '''
import numba

@numba.njit(cache=True)
def scale(a):
    for j in range(a.shape[0]):
        a[j] *= 2.0
'''

CONTESTANTS = {
    "gradcells": ("import gradcells as gc", "gc.lstm_cell(x, h, h, w, b)"),
    "plain numba": ("from startup_floor import scale", "scale(b)"),
    "reference": ("import gradcells as gc", "gc.lstm_cell(x, h, h, w, b, backend='reference')"),
    "torch": ("import torch\ncell = torch.nn.LSTMCell(32, 32)\ntorch.set_grad_enabled(False)",
              "cell(torch.from_numpy(x), (torch.from_numpy(h), torch.from_numpy(h)))"),
    "gradcells sequence + grad": (
        "import gradcells as gc",
        "s = gc.lstm_sequence(xs, h, h, w, b); gc.lstm_sequence_grad(xs, h, h, w, b, s, d_h=s.h)"),
    "torch nn.LSTM + backward": (
        "import torch\nlstm = torch.nn.LSTM(32, 32)",
        "lstm(torch.from_numpy(xs).requires_grad_())[0].sum().backward()"),
}


def run_once(name: str, workdir: str) -> dict:
    imports, call = CONTESTANTS[name]
    program = _TIMER.format(imports=imports, call=call)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [workdir] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: the timing process failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--skip", default="", help="comma list of: plain numba, reference, torch")
    parser.add_argument("--load", action="store_true",
                        help="one busy-loop process per core beside every round")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    if "torch" not in skip and missing("torch"):
        print(f"skipping torch: {missing('torch')}")
        skip.add("torch")
    names = [n for n in CONTESTANTS if n not in skip
             and not ("torch" in skip and n.startswith("torch"))]
    with busy_loops(os.cpu_count() or 1) if args.load else contextlib.nullcontext():
        times = timed(names, args.repeats)
    load = f", beside {os.cpu_count()} busy-loop processes" if args.load else ""
    print(f"New process per call, warm Numba cache; median of {args.repeats} interleaved "
          f"rounds{load}. {sys.version.split()[0]} on {os.cpu_count()} cores.\n")
    rows = []
    for name in names:
        med = {k: statistics.median(t[k] for t in times[name]) for k in times[name][0]}
        rows.append([name, duration(med["import"]), duration(med["first"]),
                     duration(med["import"] + med["first"]), duration(med["second"])])
    print(table(rows, ["contestant", "import", "first call", "import + first call",
                       "second call"]))


def timed(names, repeats):
    """Every contestant's times in fresh processes, after one round that fills the caches."""
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "startup_floor.py"), "w") as f:
            f.write(_NUMBA_FLOOR)
        for name in names:                  # fill the caches
            run_once(name, workdir)
        times = {name: [] for name in names}
        for _ in range(repeats):
            for name in names:
                times[name].append(run_once(name, workdir))
    return times


if __name__ == "__main__":
    main()
