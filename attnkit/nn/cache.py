"""Key/value cache for incremental decoding: the chapter's greedy loop without recomputing the
prefix.

At step t the decoder needs the keys and values of every earlier position; they do not
change once computed (the causal mask [eq:att-mask] keeps the past blind to the future), so
each self-attention layer appends its new ones and each cross-attention layer computes the
memory's once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class KVCache:
    """Keys and values of one attention module, each ``(B, H, T, d)``.

    ``static=False`` (self-attention): :meth:`update` appends along time into preallocated
    buffers that double when full, so one decoding step copies only the new position (not
    the whole prefix) and its cost stays flat as the prefix grows.
    ``static=True`` (cross-attention): the first :meth:`update` stores the memory's keys and
    values; :class:`~attnkit.nn.attention.MultiHeadAttention` reuses them afterwards.
    """

    def __init__(self, static: bool = False, capacity: int = 64) -> None:
        self.static = static
        self.capacity = capacity  # positions allocated on the first update (at least)
        self._k: Tensor | None = None  # (B, H, capacity, d_k)
        self._v: Tensor | None = None  # (B, H, capacity, d_v)
        self._length = 0

    @property
    def k(self) -> Tensor | None:
        if self._k is None or self.static:
            return self._k
        return self._k[..., : self._length, :]  # the filled part of the buffer

    @property
    def v(self) -> Tensor | None:
        if self._v is None or self.static:
            return self._v
        return self._v[..., : self._length, :]

    def __len__(self) -> int:
        return self._length

    def filled(self) -> tuple[Tensor, Tensor]:
        """The keys and values held, (B, H, len(self), d) each."""
        if self.k is None or self.v is None:
            raise ValueError("the cache holds no keys yet")
        return self.k, self.v

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new ``k``, ``v`` (B, H, t, d); return all cached keys and values."""
        t = k.shape[-2]
        if self.static:
            # Stored contiguous: read at every step, a strided view would be copied every time.
            self._k, self._v, self._length = k.contiguous(), v.contiguous(), t
            return self._k, self._v
        if self._k is None or self._length + t > self._k.shape[-2]:
            self._grow(k, v, max(self._length + t, 2 * self._length, self.capacity))
        self._k[..., self._length : self._length + t, :] = k
        self._v[..., self._length : self._length + t, :] = v
        self._length += t
        return self.k, self.v

    def attend(
        self, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, whole: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Add the new ``k``, ``v`` (B, H, t, d) and return what the queries attend to: keys,
        values, ``mask`` and ``bias``; the filled part, or with ``whole`` (a decoding step, see
        :meth:`whole`) the whole buffers."""
        k, v = self.update(k, v)
        return self.whole(mask, bias) if whole else (k, v, mask, bias)

    def whole(self, mask: Tensor | None, bias: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The whole buffers (B, H, capacity, d) as keys and values, with ``mask`` and ``bias``
        (over the filled positions) widened to the capacity, the unfilled positions masked out.

        For a decoding step: a matmul reads a dense buffer as it is, where the filled part of
        it, a slice, is copied first (measured here, bf16, 128 rows x 8 heads x 25 keys: 430 µs
        for the slice against 163 for a dense 64; the buffer is at most twice the filled part).
        """
        if self._k is None or self._v is None or self.static:
            raise ValueError("whole() reads a self-attention cache that holds keys; update it first")
        capacity, filled = self._k.shape[-2], self._length
        valid = torch.arange(capacity, device=self._k.device) < filled  # (capacity,)
        mask = valid if mask is None else F.pad(mask, (0, capacity - filled), value=False)
        if bias is not None:
            bias = F.pad(bias, (0, capacity - filled))
        return self._k, self._v, mask, bias

    def _grow(self, k: Tensor, v: Tensor, size: int) -> None:
        # Zeros, not empty: whole() reads the unfilled positions too (masked, but 0 x NaN is NaN).
        new_k = k.new_zeros(*k.shape[:-2], size, k.shape[-1])  # (B, H, size, d_k)
        new_v = v.new_zeros(*v.shape[:-2], size, v.shape[-1])
        if self._k is not None:
            new_k[..., : self._length, :] = self.k
            new_v[..., : self._length, :] = self.v
        self._k, self._v = new_k, new_v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (finished rows dropped, or rows re-ranked). Only the
        filled positions are copied, not the whole buffer."""
        if self._k is None:
            return
        if self.static:
            self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)
            return
        filled = self._length
        for name in ("_k", "_v"):
            old: Tensor = getattr(self, name)
            new = old.new_zeros(index.shape[0], *old.shape[1:])  # (N', H, capacity, d)
            new[..., :filled, :] = old[..., :filled, :].index_select(0, index)
            setattr(self, name, new)


class BeamHistory:
    """Which earlier entries each beam descends from, shared by the layers of a decoder.

    ``origin[b, i, t] = j``: the key and value of beam i of example b at time t are in the
    slot of beam j. Beam search re-ranks by gathering this small integer table (B, k, T)
    instead of copying every layer's keys and values (the index history). ``fixed`` (the
    compiled step's): the table keeps its one tensor, re-ranked in place, which the step reads."""

    def __init__(self, groups: int, fixed: bool = False) -> None:
        self.groups, self.fixed = groups, fixed
        self.origin: Tensor | None = None  # (B, k, capacity) long
        self._stamped = -1  # the last time whose slots were stamped as each beam's own
        self._masks: dict[int, Tensor] = {}  # filled -> ancestry mask

    def start(self, batch: int, length: int, capacity: int, device: torch.device) -> None:
        """The prompt (or start token): every beam of an example holds the same, each its own copy."""
        own = torch.arange(self.groups, device=device)[None, :, None]  # (1, k, 1)
        self.origin = own.expand(batch, self.groups, max(capacity, length)).contiguous()
        self._stamped, self._masks = length - 1, {}

    def stamp(self, t: int) -> None:
        """Time ``t`` is being written: each beam's own entry is in its own slot."""
        if t == self._stamped or self.origin is None:
            return
        if t >= self.origin.shape[2]:
            grown = self.origin.new_zeros(*self.origin.shape[:2], 2 * self.origin.shape[2])
            grown[..., : self.origin.shape[2]] = self.origin
            self.origin = grown
        self.origin[:, :, t] = torch.arange(self.groups, device=self.origin.device)
        self._stamped, self._masks = t, {}

    def reorder(self, parents: Tensor, examples: Tensor | None) -> None:
        """New beam i of each example continues its old beam ``parents[b, i]`` (B', k); with
        ``examples`` (B',) only those examples remain."""
        if self.origin is None:
            return
        if self.fixed and examples is not None:
            raise ValueError("a fixed-shape beam history keeps every example: the compiled step's shapes do not change")
        origin = self.origin if examples is None else self.origin.index_select(0, examples)
        reordered = origin.gather(1, parents[:, :, None].expand(-1, -1, origin.shape[2]))
        if self.fixed:
            self.origin.copy_(reordered)
        else:
            self.origin = reordered
        self._masks = {}

    def mask(self, filled: int) -> Tensor:
        """(B, 1, k, filled·k) bool: query beam i may attend the slot (t, j) of an ancestor."""
        if filled not in self._masks:
            assert self.origin is not None
            self._masks = {filled: self._ancestry(self.origin.new_ones(filled, dtype=torch.bool))}
        return self._masks[filled]

    def reach(self, slot: Tensor, capacity: int) -> Tensor:
        """:meth:`mask` up to and including the position ``slot`` (1,) a compiled step writes,
        from tensors alone (inside the step's graph)."""
        assert self.origin is not None
        return self._ancestry(torch.arange(capacity, device=slot.device) <= slot)

    def _ancestry(self, valid: Tensor) -> Tensor:
        """(B, 1, k, capacity·k): ancestors' slots at the times ``valid`` (capacity,) marks."""
        assert self.origin is not None
        g, capacity = self.groups, valid.shape[0]
        slots = torch.arange(g, device=self.origin.device)
        ancestry = self.origin[:, :, :capacity, None] == slots  # (B, k, capacity, k)
        ancestry &= valid[:, None]
        return ancestry.view(ancestry.shape[0], 1, g, capacity * g)


class BeamKVCache:
    """The keys and values of one self-attention module during beam search, k beams per
    example stored side by side: ``(B, H, capacity·k, d)``, time-major, the slot of beam j at
    time t at position t·k + j.

    A step writes each beam's new entry in its own slot and never moves an earlier one: the
    :class:`BeamHistory` says which slots are a beam's ancestors, as a mask. The k beams of an
    example then attend as k queries of one row to one dense buffer (grouped, as
    cross-attention groups them over a shared memory), so re-ranking copies nothing.
    """

    static = False

    def __init__(self, history: BeamHistory, capacity: int = 64) -> None:
        self.history, self.capacity = history, capacity
        self._k: Tensor | None = None  # (B, H, capacity·k, d_k)
        self._v: Tensor | None = None
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def attend(
        self, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, whole: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Write the new ``k``, ``v`` (B·k, H, t, d); return the keys, values, mask and bias
        the queries attend to. The first call (the prompt or start token) attends to its own
        keys as usual; after it, one position per step: the filled slots (B, H, filled·k, d), a
        view of the buffers (attending over the whole buffers was 6% of the Marian-shaped batch's
        time with AVX2 kernels: on average half of them are empty), with the ancestry mask,
        ``mask`` (key padding, (B·k, 1, 1, filled)) and ``bias`` (1, H, 1, filled) laid out over
        the slots."""
        g = self.history.groups
        N, H, t, _ = k.shape
        B = N // g
        if self._length == 0:
            capacity = max(self.capacity, t)
            self._k, self._v = (x.new_zeros(B, H, capacity * g, x.shape[-1]) for x in (k, v))
            for buffer, new in ((self._k, k), (self._v, v)):
                # (B·k, H, t, d) -> (B, H, t, k, d): slot t·k + j
                buffer.view(B, H, capacity, g, -1)[:, :, :t] = new.reshape(B, g, H, t, -1).permute(0, 2, 3, 1, 4)
            self._length = t
            self.history.start(B, t, capacity, k.device)
            return k, v, mask, bias
        if t != 1:
            raise ValueError(f"a beam search cache takes one new position per step, got {t}")
        assert self._k is not None and self._v is not None
        capacity, filled = self._k.shape[2] // g, self._length
        if filled == capacity:
            self._grow(2 * capacity)
            capacity *= 2
        self.history.stamp(filled)
        for buffer, new in ((self._k, k), (self._v, v)):
            buffer.view(B, H, capacity, g, -1)[:, :, filled] = new.reshape(B, g, H, -1).transpose(1, 2)
        self._length = filled = filled + 1
        attend, bias = self._over_slots(self.history.mask(filled), mask, bias, filled)
        return self._k[:, :, : filled * g], self._v[:, :, : filled * g], attend, bias

    def _over_slots(
        self, attend: Tensor, mask: Tensor | None, bias: Tensor | None, positions: int
    ) -> tuple[Tensor, Tensor | None]:
        """The ancestry mask ``attend`` (B, 1, k, positions·k) and the ``bias`` (1, H, 1,
        positions) over the k slots of each position, the key padding ``mask`` (B·k, 1, 1,
        positions) joined in: an example's beams share their prompt's padding, beam 0's."""
        g = self.history.groups
        if mask is not None:
            example = mask[::g].reshape(-1, 1, 1, positions, 1).expand(-1, -1, -1, -1, g)
            attend = attend & example.reshape(-1, 1, 1, positions * g)
        return attend, None if bias is None else bias.repeat_interleave(g, dim=-1)

    def _grow(self, capacity: int) -> None:
        assert self._k is not None and self._v is not None
        filled = self._length * self.history.groups
        for name in ("_k", "_v"):
            old: Tensor = getattr(self, name)
            new = old.new_zeros(*old.shape[:2], capacity * self.history.groups, old.shape[-1])
            new[:, :, :filled] = old[:, :, :filled]
            setattr(self, name, new)

    def select(self, examples: Tensor) -> None:
        """Keep the examples ``examples`` (B',): the others are done."""
        if self._k is not None and self._v is not None:
            self._k, self._v = self._k.index_select(0, examples), self._v.index_select(0, examples)


class StepClock:
    """Where a fixed-shape decoding step writes, shared by the layers of a decoder: ``slot``, a
    (1,) tensor the compiled graph reads (a Python int there would be a constant, and every
    step a new graph), and ``filled``, the same count as an int for the eager code around it."""

    def __init__(self) -> None:
        self.slot: Tensor | None = None  # (1,) long: the position the next step writes
        self.filled = 0

    @property
    def stepping(self) -> bool:
        """True once the prompt is in: every later call is a one-position step."""
        return self.slot is not None

    def begin(self, length: int, device: torch.device) -> None:
        if self.slot is None:
            self.slot = torch.full((1,), length, dtype=torch.long, device=device)
            self.filled = length

    def advance(self) -> None:
        """After a step: the next one writes one position further (in place, outside the graph)."""
        assert self.slot is not None
        self.slot += 1
        self.filled += 1


class FixedBeamKVCache(BeamKVCache):
    """A :class:`BeamKVCache` of exactly ``capacity`` positions, for the compiled step: beam
    search in one fixed-shape graph. The start (the prompt or start token) is the eager cache's;
    each later call writes the k beams' new entries at ``clock.slot`` and attends over the whole
    buffers with the ancestry mask the step computes from the history's table
    (:meth:`BeamHistory.reach`), the positions after the slot masked out."""

    def __init__(self, history: BeamHistory, clock: StepClock, capacity: int) -> None:
        super().__init__(history, capacity)
        self.clock = clock

    def __len__(self) -> int:
        return self.clock.filled

    def attend(
        self, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, whole: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """As :meth:`BeamKVCache.attend`; after the start, a step's ``mask`` (key padding,
        (B·k, 1, 1, capacity)) and ``bias`` (1, H, 1, capacity) already span the capacity."""
        g, capacity = self.history.groups, self.capacity
        if self._k is None or self._v is None:  # the start
            if k.shape[-2] > capacity:
                raise ValueError(f"a prompt of {k.shape[-2]} positions does not fit a fixed cache of {capacity}")
            started = super().attend(k, v, mask, bias)
            self.clock.begin(k.shape[-2], k.device)
            return started
        slot = self.clock.slot
        assert slot is not None
        B, H = k.shape[0] // g, k.shape[1]
        # The k slots of time t, t·k .. t·k + k - 1, written in the buffers themselves (a write through
        # a view of them would be a copy of the whole buffers in the graph).
        slots = slot * g + torch.arange(g, device=slot.device)  # (k,)
        for buffer, new in ((self._k, k), (self._v, v)):  # (B·k, H, 1, d) -> (B, H, k, d)
            buffer.index_copy_(2, slots, new.reshape(B, g, H, -1).transpose(1, 2))
        attend, bias = self._over_slots(self.history.reach(slot, capacity), mask, bias, capacity)
        return self._k, self._v, attend, bias


class StaticKVCache:
    """Keys and values of one self-attention module in buffers of a fixed ``capacity``,
    ``(B, H, capacity, d)``: a decoding step's shapes never change, so the step compiles once
    (:mod:`attnkit.generation.compiled`).

    The prompt (the first call) fills positions 0 .. t-1 and attends to its own keys as usual.
    Each later call writes its one new key and value at ``clock.slot`` and returns the whole
    buffers, the positions after the slot masked out; the caller advances the clock.
    """

    static = False

    def __init__(self, clock: StepClock, capacity: int) -> None:
        self.clock, self.capacity = clock, capacity
        self._k: Tensor | None = None  # (B, H, capacity, d_k)
        self._v: Tensor | None = None

    def __len__(self) -> int:
        return self.clock.filled

    def filled(self) -> tuple[Tensor, Tensor]:
        """The keys and values of positions 0 .. len(self) - 1, (B, H, len(self), d) each."""
        if self._k is None or self._v is None:
            raise ValueError("the cache holds no keys yet")
        return self._k[..., : self.clock.filled, :], self._v[..., : self.clock.filled, :]

    def put(self, rows: Tensor, k: Tensor, v: Tensor, end: int, batch: int) -> None:
        """Write ``k``, ``v`` (u, H, t, d) into rows ``rows`` (u,) at positions end - t .. end - 1,
        outside a step (continuous batching's layout); the first write makes the buffers, of
        ``batch`` rows. Positions are not checked against the clock: the caller sets it."""
        if self._k is None or self._v is None:
            self._k = k.new_zeros(batch, k.shape[1], self.capacity, k.shape[-1])  # zeros: 0 x NaN would be NaN
            self._v = v.new_zeros(batch, v.shape[1], self.capacity, v.shape[-1])
        t = k.shape[-2]
        if not 0 <= end - t <= end <= self.capacity:
            raise ValueError(f"positions {end - t} .. {end - 1} are not within a fixed cache of {self.capacity}")
        self._k[rows, :, end - t : end] = k
        self._v[rows, :, end - t : end] = v

    def attend(
        self, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, whole: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Write the new ``k``, ``v`` (B, H, t, d). A step's ``mask`` and ``bias`` already span
        the capacity (B or 1, ·, 1, capacity); ``whole`` is implied."""
        if self._k is None or self._v is None:  # the prompt
            t = k.shape[-2]
            if t > self.capacity:
                raise ValueError(f"a prompt of {t} positions does not fit a fixed cache of {self.capacity}")
            self._k = k.new_zeros(*k.shape[:-2], self.capacity, k.shape[-1])  # zeros: 0 x NaN would be NaN
            self._v = v.new_zeros(*v.shape[:-2], self.capacity, v.shape[-1])
            self._k[..., :t, :], self._v[..., :t, :] = k, v
            self.clock.begin(t, k.device)
            return k, v, mask, bias
        slot = self.clock.slot
        assert slot is not None
        self._k.index_copy_(2, slot, k)
        self._v.index_copy_(2, slot, v)
        valid = (torch.arange(self.capacity, device=k.device) <= slot).view(1, 1, 1, -1)  # (1, 1, 1, capacity)
        return self._k, self._v, valid if mask is None else mask & valid, bias


class DecoderCache:
    """The caches of a decoder stack: one self-attention and (optionally) one cross-attention
    :class:`KVCache` per layer. ``groups`` > 1 (beam search with that many beams per
    example): the self-attention caches are :class:`BeamKVCache`, re-ranked by one shared
    :class:`BeamHistory`. ``fixed``: :class:`StaticKVCache` (or :class:`FixedBeamKVCache`) of
    exactly ``capacity`` positions, written where one shared :class:`StepClock` says (the compiled
    step)."""

    def __init__(
        self, n_layers: int, cross_attention: bool, capacity: int = 64, groups: int = 1, fixed: bool = False
    ) -> None:
        self.groups, self.capacity = groups, capacity
        self.history = BeamHistory(groups, fixed) if groups > 1 else None
        self.clock = StepClock() if fixed else None
        self.self_attn: list[KVCache | BeamKVCache | StaticKVCache] = [self._layer() for _ in range(n_layers)]
        self.cross_attn: list[KVCache | None] = [
            KVCache(static=True) if cross_attention else None for _ in range(n_layers)
        ]

    def _layer(self) -> KVCache | BeamKVCache | StaticKVCache:
        if self.clock is not None:
            if self.history is not None:
                return FixedBeamKVCache(self.history, self.clock, self.capacity)
            return StaticKVCache(self.clock, self.capacity)
        return KVCache(capacity=self.capacity) if self.history is None else BeamKVCache(self.history, self.capacity)

    def __len__(self) -> int:
        """Number of target positions already processed."""
        return len(self.self_attn[0]) if self.self_attn else 0

    @property
    def fixed_step(self) -> bool:
        """True while a fixed-shape cache runs its steps (the prompt is in): positions come from
        ``clock.slot``, a tensor, and keys span the capacity."""
        return self.clock is not None and self.clock.stepping

    def reorder(self, index: Tensor, examples: Tensor | None = None) -> None:
        """Keep target rows ``index`` (N',); ``examples`` (B'): the examples (memory rows) that
        remain, when some were dropped. Without it the memory's keys and values are left alone:
        right when ``index`` only permutes rows that share a memory row (an example's beams). A
        fixed-shape cache keeps its rows: only beams are re-ranked, within each example."""
        if self.clock is not None and (self.history is None or examples is not None):
            raise ValueError("a fixed-shape cache keeps its rows: the compiled step's shapes do not change")
        if self.history is not None:  # beams: re-rank through the history, drop whole examples
            if examples is not None:
                for beams in self.self_attn:
                    beams.select(examples)  # type: ignore[union-attr]
            # (B', k): an example's new beams come from its old ones, rows b·k .. b·k + k - 1
            self.history.reorder(index.view(-1, self.groups) % self.groups, examples)
        else:
            for cache in self.self_attn:
                cache.reorder(index)  # type: ignore[union-attr]
        if examples is not None:
            for cross in self.cross_attn:
                if cross is not None:
                    cross.reorder(examples)

    def put(self, rows: Tensor, source: DecoderCache, index: Tensor, keep: int, end: int, batch: int) -> None:
        """Into rows ``rows`` (u,) of this fixed-shape cache (:meth:`StaticKVCache.put`), the last
        ``keep`` filled positions of ``source``'s rows ``index`` (u,), at positions end - keep ..
        end - 1: a continuous batch laying its rows out (the prefill of the requests that join,
        or the rows of its previous layout); ``batch``: the rows of the buffers, made at the
        first write."""
        if self.clock is None or self.history is not None or source.history is not None:
            raise ValueError("put() fills a fixed-shape cache from the caches of a stack decoded without beams")
        for mine, theirs in zip(self.self_attn, source.self_attn, strict=True):
            k, v = (t.index_select(0, index)[..., t.shape[-2] - keep :, :] for t in theirs.filled())  # type: ignore[union-attr]
            mine.put(rows, k, v, end, batch)  # type: ignore[union-attr]
