"""Time and peak memory of attention's two paths as the sequence grows (issue: performance):
the readable math path, which materialises the n × n weights of [eq:att-alpha], against the
fused path (``torch.nn.functional.scaled_dot_product_attention``), whose memory must grow
linearly in n.

Each case runs in a fresh Python process (Linux): after a warm-up call it resets the
process's peak resident size (``/proc/self/clear_refs``), calls once more, and reports the
peak (``VmHWM``) less the resident size before the call — the memory the call needed. CPU
tensors have no allocator statistics to read, and a shared process would mix the cases.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

CASE = """
import json, time, torch
from attnkit.nn.attention import attention_fused, attention_math
n, path, heads, d_k = {n}, {path!r}, {heads}, {d_k}
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, heads, n, d_k, generator=g) for _ in range(3))
fn = attention_math if path == "math" else attention_fused

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

with torch.no_grad():
    fn(q, k, v, is_causal=True)  # the first call loads kernels and warms the allocator
    before = status("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    start = time.perf_counter()
    fn(q, k, v, is_causal=True)
    seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "extra_bytes": status("VmHWM:") - before}}))
"""


def measure(n: int, path: str, heads: int = 2, d_k: int = 64) -> dict[str, float]:
    """One causal self-attention call over ``n`` tokens on ``path`` ("math" or "fused")."""
    code = CASE.format(n=n, path=path, heads=heads, d_k=d_k)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(small: bool = False, repeats: int = 3) -> dict[int, dict[str, dict[str, float]]]:
    """{n: {path: {"seconds": median, "extra_bytes": median}}} for n up to 16k (2k when small)."""
    lengths = (512, 1024, 2048) if small else (1024, 2048, 4096, 8192, 16384)
    table: dict[int, dict[str, dict[str, float]]] = {}
    for n in lengths:
        table[n] = {}
        for path in ("math", "fused"):
            runs = [measure(n, path) for _ in range(repeats)]
            table[n][path] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return table
