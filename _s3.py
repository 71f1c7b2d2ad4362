import numpy as np
from gradcells.testing import pairs
for op in pairs.OPS:
    if "slstm" not in op: continue
    for seed in range(3):
        rng = np.random.default_rng(seed)
        case = pairs.OPS[op][0](rng)
        for check in (pairs.vjp_check, pairs.jvp_check, pairs.grad_jvp_check):
            rep = check(op, case)
            print(op, seed, check.__name__, rep.passed if hasattr(rep,"passed") else rep)
