"""The dataset store: a corpus tokenized once into flat token arrays with an index, reused by
every later run on the same data and tokenizer.

A store is a directory named by what it was made from (:class:`Recipe`): the inputs' sizes and
SHA-256, the settings that decide the examples and their split, and the tokenizer (the settings
it is trained with, or the SHA-256 of a given one). Inside, for each split (train, valid, test)
and side (``text``, or ``source`` and ``target`` for pairs)::

    {split}.{side}.ids   the token ids of every example, end to end (uint16 below 65,536 ids, else uint32)
    {split}.{side}.idx   int64 offsets: example i is ids[idx[i]:idx[i+1]]   (nanoGPT's train.bin,
                         Megatron's indexed dataset: np.memmap reads both)
    {split}.labels       int32 class of each example (labelled text)
    {valid,test}.jsonl   the held-out examples as text, for evaluation and BLEU
    tokenizer.json       the tokenizer the ids are of
    manifest.json        the recipe, counts, and every file's size and SHA-256; written last

The ids are stored whole; a view cuts them to the run's ``data.max_tokens`` as it reads, so one
store serves runs that differ only in that. A store is built in a temporary directory and
renamed into place when complete, so an interrupted or failed build (a kill, a full disk) never
leaves a store that is used: the next run starts it again. Opening checks every file against
the manifest (sizes and hashes); a store that fails is reported in one line and rebuilt. A
changed input has another name: a new store is built beside the old one, never over it.

Examples are read with positional reads (``os.pread``), not through a memory map: pages of a
map that training touches would count in the process's resident memory and grow with the
corpus over an epoch, where reads go through the page cache and leave it flat.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import itertools
import json
import logging
import os
import shutil
import socket
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, overload

import numpy as np
from tokenizers import Tokenizer

from attnkit.data.files import Kind
from attnkit.durable import fsync_dir

log = logging.getLogger(__name__)

VERSION = 1  # of the layout: a store of another version is never opened (a new one is built)
FORMAT = "attnkit-dataset-store"
MANIFEST, TOKENIZER = "manifest.json", "tokenizer.json"
SPLITS = ("train", "valid", "test")
SIDES: dict[Kind, tuple[str, ...]] = {"lines": ("text",), "pairs": ("source", "target"), "labeled": ("text",)}
HELD_OUT = ("valid", "test")
# The tokenizer learns from at most this much of the training text: every k-th training
# example, k = ceil(corpus bytes / TOKENIZER_SAMPLE_BYTES); below it, from all of it in order
# (the built-in corpora, whose tokenizers are thus what they were before the store).
TOKENIZER_SAMPLE_BYTES = 32_000_000
ENCODE_CHUNK_BYTES = 4_000_000  # text handed to the tokenizer's batch encoding at once (both cores)
ENV = "ATTNKIT_STORE"


class StoreCorruptError(ValueError):
    """A store whose files do not match its manifest."""


def root() -> Path:
    """Where stores live: ``$ATTNKIT_STORE``, else ``$XDG_CACHE_HOME/attnkit/stores`` (by
    default ``~/.cache/attnkit/stores``). Stores are derived data: deleting one costs a rebuild."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "attnkit" / "stores"


def sha256_file(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def describe_input(path: Path) -> dict[str, Any]:
    """An input as a recipe records it: its name, size and SHA-256 (its path is not part of it:
    the same content elsewhere is the same data)."""
    return {"name": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


@dataclass(frozen=True)
class Recipe:
    """What a store is made from. ``settings`` decide the examples and their split (JSON
    values); ``vocab`` the tokenizer attnkit trains on them, when none is given."""

    kind: Kind
    inputs: tuple[dict[str, Any], ...]
    settings: dict[str, Any] = field(hash=False)
    vocab: dict[str, Any] = field(hash=False)

    def examples_key(self) -> str:
        """The hash of what decides the examples and their split, whatever the tokenizer."""
        return _digest({"version": VERSION, "kind": self.kind, "inputs": self.inputs, "settings": self.settings})

    def tokenizer_key(self, given: str | None) -> str:
        """The hash of the tokenizer: trained with ``vocab``, or ``given`` (its SHA-256)."""
        return _digest({"given": given} if given else {"trained": self.vocab, "sample": TOKENIZER_SAMPLE_BYTES})

    def name(self, given: str | None) -> str:
        return f"{self.examples_key()[:16]}-{self.tokenizer_key(given)[:16]}"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


class Source(Protocol):
    """A corpus being read into a store: its examples in order, each with its split, and the
    texts the tokenizer learns from."""

    total_bytes: int  # the text read, for the progress shown
    labels: tuple[str, ...]  # labelled text: the class names, index = class; () otherwise

    def examples(self) -> Iterator[tuple[str, Any]]: ...

    def tokenizer_texts(self) -> Iterator[str]: ...


Progress = Callable[[float, str], Any]  # (total bytes, description) -> a ProgressReport-like object


def _quiet(total: float, desc: str) -> Any:
    class Silent:
        def update(self, n: float) -> None: ...

        def close(self) -> None: ...

    return Silent()


# -- reading ---------------------------------------------------------------------------------


class Rows:
    """One side of one split: row ``i`` is ``ids[idx[i]:idx[i+1]]``, read on demand."""

    def __init__(self, directory: Path, stem: str, dtype: np.dtype, count: int) -> None:
        self.dtype, self.count = np.dtype(dtype), count
        self._ids = os.open(directory / f"{stem}.ids", os.O_RDONLY)
        self._idx = os.open(directory / f"{stem}.idx", os.O_RDONLY)
        weakref.finalize(self, _close, self._ids, self._idx)

    def __len__(self) -> int:
        return self.count

    def row(self, i: int) -> np.ndarray:
        start, end = np.frombuffer(os.pread(self._idx, 16, 8 * i), dtype="<i8")
        size = self.dtype.itemsize
        return np.frombuffer(os.pread(self._ids, int(end - start) * size, int(start) * size), dtype=self.dtype)

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """(count,) int32: every row's length, read a million offsets at a time, once (batching
        and its source order each ask)."""
        out = np.empty(self.count, dtype=np.int32)
        step = 1 << 20
        for first in range(0, self.count, step):
            n = min(step, self.count - first)
            offsets = np.frombuffer(os.pread(self._idx, 8 * (n + 1), 8 * first), dtype="<i8")
            out[first : first + n] = np.diff(offsets)
        return out


class Picked:
    """Some rows of a :class:`Rows` (``index``, increasing), read on demand as it reads them."""

    def __init__(self, rows: Rows | Picked, index: np.ndarray) -> None:
        self.rows, self.index, self.count = rows, index, len(index)

    def __len__(self) -> int:
        return self.count

    def row(self, i: int) -> np.ndarray:
        return self.rows.row(int(self.index[i]))

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        return self.rows.lengths[self.index]


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Examples(Sequence[Any]):
    """A split of a store as the training code reads examples: ``examples[i]`` is a list of
    ids (lines), a ``(source, target)`` pair of lists, or ``(ids, class)``, cut to
    ``max_tokens`` as :func:`attnkit.data.prepare.encode` and ``encode_labeled`` cut them
    (room left for the objective's specials; a labelled row keeps its closing special)."""

    def __init__(self, kind: Kind, rows: Sequence[Rows | Picked], labels: np.ndarray | None, max_tokens: int) -> None:
        self.kind, self.rows, self.labels, self.max_tokens = kind, rows, labels, max_tokens

    def __len__(self) -> int:
        return len(self.rows[0])

    def __eq__(self, other: object) -> bool:
        """Equal to a split or list holding the same examples in the same order."""
        if not isinstance(other, (Examples, list)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if not -len(self) <= i < len(self):
            raise IndexError(f"example {i} of a split of {len(self)}")
        i %= len(self)
        if self.kind == "labeled":
            from attnkit.data.tokenizer import fit

            assert self.labels is not None
            return fit(self.rows[0].row(i).tolist(), self.max_tokens), int(self.labels[i])
        cut = [rows.row(i)[: self.max_tokens - 2].tolist() for rows in self.rows]
        return tuple(cut) if self.kind == "pairs" else cut[0]

    def take(self, index: np.ndarray) -> Examples:
        """The examples at ``index`` (increasing), a view that reads them on demand."""
        labels = None if self.labels is None else self.labels[index]
        return Examples(self.kind, [Picked(rows, index) for rows in self.rows], labels, self.max_tokens)

    def costs(self) -> np.ndarray:
        """(n,) int32: the padded positions each example takes in a batch, specials included
        (:func:`attnkit.data.prepare.cost` of each, without reading one)."""
        if self.kind == "labeled":
            return np.minimum(self.rows[0].lengths, self.max_tokens)
        cut = [np.minimum(rows.lengths, self.max_tokens - 2) for rows in self.rows]
        return cut[0] + 2 if self.kind == "lines" else np.maximum(*cut) + 1

    def within(self) -> np.ndarray | None:
        """Pairs: each source's length (how a bucket is ordered); None otherwise."""
        return np.minimum(self.rows[0].lengths, self.max_tokens - 2) if self.kind == "pairs" else None


@dataclass
class Store:
    """An opened store: its manifest and tokenizer, and its splits as :class:`Examples`."""

    directory: Path
    manifest: dict[str, Any]
    tokenizer: Tokenizer
    built: bool = False  # built by this call, not found

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.manifest["labels"])

    def examples(self, split: str, max_tokens: int) -> Examples:
        kind = self.manifest["kind"]
        count = self.manifest["splits"][split]["examples"]
        dtype = np.dtype(self.manifest["dtype"])
        rows = [Rows(self.directory, f"{split}.{side}", dtype, count) for side in SIDES[kind]]
        labels = None
        if kind == "labeled":
            labels = np.fromfile(self.directory / f"{split}.labels", dtype="<i4")
        return Examples(kind, rows, labels, max_tokens)


def read_held_out(directory: Path, split: str) -> list[Any]:
    with (directory / f"{split}.jsonl").open(encoding="utf-8") as file:
        return [e if isinstance(e, str) else tuple(e) for e in map(json.loads, file)]


def open_store(directory: Path) -> Store:
    """Open the store in ``directory``, every file checked against its manifest; a store that
    fails a check raises :class:`StoreCorruptError` saying which file and how."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise StoreCorruptError(f"{directory / MANIFEST} cannot be read ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise StoreCorruptError(f"{directory / MANIFEST} is not a version-{VERSION} attnkit dataset store manifest")
    for name, expected in manifest["files"].items():
        path = directory / name
        size = path.stat().st_size if path.is_file() else None
        if size != expected["bytes"]:
            found = "missing" if size is None else f"{size} bytes"
            raise StoreCorruptError(f"{path} is {found}, its manifest says {expected['bytes']} bytes (truncated?)")
        if sha256_file(path) != expected["sha256"]:
            raise StoreCorruptError(f"{path} does not match its manifest's SHA-256 (changed or corrupted on disk)")
    tokenizer = Tokenizer.from_file(str(directory / TOKENIZER))
    return Store(directory, manifest, tokenizer)


def find(recipe: Recipe, given: Tokenizer | None) -> Path | None:
    """The complete store of ``recipe`` and tokenizer ``given`` (None: the one attnkit trains),
    if there is one. A given tokenizer that is the one a store trained (a resumed run's, an
    evaluated model's) finds that store."""
    base = root()
    if given is None:
        directory = base / recipe.name(None)
        return directory if (directory / MANIFEST).is_file() else None
    sha = sha256_text(given.to_str())
    trained = base / recipe.name(None)
    with contextlib.suppress(OSError, ValueError, KeyError):
        if json.loads((trained / MANIFEST).read_text(encoding="utf-8"))["tokenizer"]["sha256"] == sha:
            return trained
    directory = base / recipe.name(sha)
    return directory if (directory / MANIFEST).is_file() else None


def find_held_out(recipe: Recipe) -> Path | None:
    """A complete store of ``recipe``'s examples, whatever its tokenizer: its held-out text."""
    base = root()
    if not base.is_dir():
        return None
    prefix = recipe.examples_key()[:16] + "-"
    return next((d for d in sorted(base.glob(prefix + "*")) if (d / MANIFEST).is_file()), None)


def open_or_build(
    recipe: Recipe,
    source: Callable[[], Source],
    tokenizer: Tokenizer | None,
    train_tokenizer: Callable[[Iterable[str]], Tokenizer],
    progress: Progress | None = None,
) -> Store:
    """The store of ``recipe`` with ``tokenizer`` (None: trained on the corpus by
    ``train_tokenizer``), opened; built first from ``source()`` where there is none, or where the
    one there fails its checks (said in one line, then rebuilt). One process builds a store at a
    time (a lock file beside it): another that needs it waits, then opens what was built."""
    found = _open_found(recipe, tokenizer)
    if found is not None:
        return found
    given = None if tokenizer is None else sha256_text(tokenizer.to_str())
    base = root()
    base.mkdir(parents=True, exist_ok=True)
    with _build_lock(base / f".{recipe.name(given)}.lock"):
        found = _open_found(recipe, tokenizer)  # built by another process while this one waited
        if found is not None:
            return found
        directory = build(base / recipe.name(given), recipe, source(), tokenizer, train_tokenizer, progress or _quiet)
    store = open_store(directory)
    return Store(store.directory, store.manifest, tokenizer or store.tokenizer, built=True)


def _open_found(recipe: Recipe, tokenizer: Tokenizer | None) -> Store | None:
    """The store :func:`find` finds, opened; None where there is none, or where it was damaged
    (then said in one line and put out of the way)."""
    directory = find(recipe, tokenizer)
    if directory is None:
        return None
    try:
        store = open_store(directory)
    except StoreCorruptError as err:
        log.warning("the dataset store %s is damaged: %s; rebuilding it", directory.name, err)
        aside = directory.with_name(f".{directory.name}.damaged-{os.getpid()}-{time.time_ns()}")
        os.rename(directory, aside)  # out of the way at once, even where a file of it cannot be removed yet
        shutil.rmtree(aside, ignore_errors=True)
        return None
    return store if tokenizer is None else Store(store.directory, store.manifest, tokenizer)


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if need be) while building."""
    import fcntl

    with path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process that is building the dataset store %s", path.stem.lstrip("."))
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# -- writing ---------------------------------------------------------------------------------


class _SplitWriter:
    """The files of one split being written: ids and offsets per side, labels, held-out text."""

    def __init__(self, directory: Path, split: str, kind: Kind, dtype: np.dtype) -> None:
        self.directory, self.split, self.kind, self.dtype = directory, split, kind, dtype
        self.ids = {side: (directory / f"{split}.{side}.ids").open("wb") for side in SIDES[kind]}
        self.idx = {side: (directory / f"{split}.{side}.idx").open("wb") for side in SIDES[kind]}
        self.ends = dict.fromkeys(SIDES[kind], 0)
        for file in self.idx.values():
            file.write(np.zeros(1, dtype="<i8").tobytes())
        self.labels = (directory / f"{split}.labels").open("wb") if kind == "labeled" else None
        self.text = (directory / f"{split}.jsonl").open("w", encoding="utf-8") if split in HELD_OUT else None
        self.count = 0
        self.tokens = dict.fromkeys(SIDES[kind], 0)

    def write_text(self, examples: list[Any]) -> None:
        if self.text is not None:
            self.text.writelines(json.dumps(e, ensure_ascii=False) + "\n" for e in examples)

    def write(self, sides: dict[str, list[list[int]]], labels: list[int] | None) -> None:
        """Rows of ids, one list per side (the same number of rows on each)."""
        for side, rows in sides.items():
            lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            total = int(lengths.sum())
            flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=self.dtype, count=total)
            self.ids[side].write(flat.astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
            offsets = self.ends[side] + np.cumsum(lengths)
            self.idx[side].write(offsets.astype("<i8").tobytes())
            self.ends[side] += total
            self.tokens[side] += total
        self.count += len(next(iter(sides.values())))
        if self.labels is not None and labels is not None:
            self.labels.write(np.asarray(labels, dtype="<i4").tobytes())

    def close(self) -> None:
        for file in [*self.ids.values(), *self.idx.values(), self.labels, self.text]:
            if file is not None:
                file.flush()
                os.fsync(file.fileno())
                file.close()


def _encoder(kind: Kind, tokenizer: Tokenizer, labels: tuple[str, ...]) -> Callable[[list[Any]], tuple]:
    """Encode a chunk of text examples: the kept rows per side, their classes, and which
    examples were kept (an example with an empty side is dropped, as in training before)."""
    from attnkit.data.tokenizer import encode_batch

    if kind == "labeled":
        from attnkit.data.tokenizer import encode_with_specials as with_specials

        index = {name: i for i, name in enumerate(labels)}

        def labeled(chunk: list[Any]) -> tuple:
            rows = with_specials(tokenizer, [text for text, _ in chunk])
            kept = [i for i, row in enumerate(rows) if row]
            return {"text": [rows[i] for i in kept]}, [index[chunk[i][1]] for i in kept]

        return labeled
    if kind == "pairs":

        def pairs(chunk: list[Any]) -> tuple:
            ids = encode_batch(tokenizer, [t for e in chunk for t in e])
            kept = [i for i in range(len(chunk)) if ids[2 * i] and ids[2 * i + 1]]
            return {"source": [ids[2 * i] for i in kept], "target": [ids[2 * i + 1] for i in kept]}, None

        return pairs

    def lines(chunk: list[Any]) -> tuple:
        return {"text": [row for row in encode_batch(tokenizer, chunk) if row]}, None

    return lines


def _chunks(examples: Iterator[tuple[str, Any]]) -> Iterator[tuple[list[tuple[str, Any]], int]]:
    """``examples`` in runs of about :data:`ENCODE_CHUNK_BYTES` of text, each with its bytes."""
    chunk, size = [], 0
    for split, example in examples:
        chunk.append((split, example))
        size += sum(len(t.encode()) for t in example) if isinstance(example, tuple) else len(example.encode())
        if size >= ENCODE_CHUNK_BYTES:
            yield chunk, size
            chunk, size = [], 0
    if chunk:
        yield chunk, size


# The store's one writer, start to rename: read, tokenize, encode each split, write the index and
# the manifest, all inside one temporary directory whose cleanup must see every step.
def build(
    directory: Path,
    recipe: Recipe,
    source: Source,
    tokenizer: Tokenizer | None,
    train_tokenizer: Callable[[Iterable[str]], Tokenizer],
    progress: Progress,
) -> Path:
    """Write the store of ``recipe`` into ``directory``: in a temporary directory beside it,
    renamed into place once complete (a store built meanwhile by another process is kept, and
    this one dropped). Returns ``directory``."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(directory.parent)
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-{os.getpid()}-{_host()}-", dir=directory.parent))
    try:
        trained = tokenizer is None
        if tokenizer is None:
            log.info("training the tokenizer")
            tokenizer = train_tokenizer(source.tokenizer_texts())
        tokenizer.save(str(tmp / TOKENIZER))
        ids = max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1  # the largest id, not the count
        dtype = np.dtype(np.uint16 if ids <= 1 << 16 else np.uint32)
        writers = {split: _SplitWriter(tmp, split, recipe.kind, dtype) for split in SPLITS}
        encode = _encoder(recipe.kind, tokenizer, source.labels)
        bar, done = progress(source.total_bytes, "tokenizing"), 0
        try:
            for chunk, size in _chunks(source.examples()):
                for split, writer in writers.items():
                    examples = [e for s, e in chunk if s == split]
                    if examples:
                        writer.write_text(examples)
                        writer.write(*encode(examples))
                done += size
                bar.update(min(done, source.total_bytes))
            bar.update(source.total_bytes)  # line ends, blank lines and tabs were read too
        finally:
            bar.close()
            for writer in writers.values():
                writer.close()
        files = {
            p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(tmp.iterdir()) if p.is_file()
        }
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "kind": recipe.kind,
            "inputs": list(recipe.inputs),
            "settings": recipe.settings,
            "tokenizer": {"sha256": sha256_text(tokenizer.to_str()), "trained": trained, "vocab": recipe.vocab},
            "tokenizer_sample_bytes": TOKENIZER_SAMPLE_BYTES,
            "dtype": dtype.name,
            "labels": list(source.labels),
            "splits": {s: {"examples": w.count, "tokens": w.tokens} for s, w in writers.items()},
            "files": files,
            "text_bytes": source.total_bytes,
            "seconds": round(time.perf_counter() - start, 2),
        }
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide it from other users of a shared store directory
        try:
            os.rename(tmp, directory)
        except OSError:
            if not (directory / MANIFEST).is_file():
                raise
            shutil.rmtree(tmp)  # another process built it first: the same store
        fsync_dir(directory.parent)
        log.info("prepared %s in %.1f s", directory, time.perf_counter() - start)
        return directory
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise OSError(
            err.errno,
            f"writing the dataset store in {directory.parent} failed ({err.strerror or err}); free some "
            f"space there, or set {ENV} to a directory on another disk",
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_synced(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


def _remove_abandoned(base: Path) -> None:
    """Remove the temporary directories of this machine's builds whose process is gone (killed
    mid-build); another machine's (a store directory on a shared disk) are left alone."""
    for tmp in base.glob(".*.tmp-*"):
        pid, host, *_ = [*tmp.name.rpartition(".tmp-")[2].split("-"), ""]
        if host == _host() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _host() -> str:
    """This machine, in a temporary directory's name: a hash of its host name."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
