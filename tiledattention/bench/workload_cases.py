"""The workloads stage's cases: packed variable-length training batches (``varlen``) and a
paged KV cache (``decode``: one new token per sequence; ``prefill``: a chunk of new tokens
per sequence), their seeded lengths, inputs, float64 references and the bytes a paged call
must read.

Lengths follow a stated lognormal (the config's ``doc_*`` and ``context_*`` keys, named in
every row as ``length_dist``): a varlen batch draws document lengths until the total is
reached (the last document cut to fit, as a packing collator does); a paged batch draws one
context per sequence. A point's lengths come from its own seed (``lengths_seed``, in the
row), derived from the study seed and what the batch is (kind, total or B), so every method,
head dim, mask and pass of one batch sees the same lengths.

How each method runs a case is its registry entry's ``workload`` (``bench/methods.py``),
which returns a ``Prepared``: the timed call (attention only) and how its output and
gradients map back to the packed layout the reference is in (not timed).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

PAGED = ("decode", "prefill")  # the kinds that read a paged KV cache
KINDS = ("varlen", *PAGED)


@dataclass(frozen=True)
class Lognormal:
    """exp(N(mu, sigma²)) rounded to an integer and clipped to [low, high]."""

    mu: float
    sigma: float
    low: int
    high: int

    def describe(self) -> str:
        return (f"lognormal(mu={self.mu:g}, sigma={self.sigma:g}; median "
                f"{math.exp(self.mu):.0f} tokens) clipped to [{self.low}, {self.high}]")

    def draw(self, rng: random.Random) -> int:
        return min(self.high, max(self.low, round(rng.lognormvariate(self.mu, self.sigma))))


def lengths_seed(seed: int, *what) -> int:
    """The seed of one batch's lengths: the study seed and what the batch is."""
    text = ":".join(map(str, (seed, *what)))
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def packed_lengths(total: int, dist: Lognormal, seed: int) -> tuple[int, ...]:
    """Document lengths summing to exactly ``total``: drawn from ``dist`` until the total is
    reached, the last one cut to fit."""
    rng, out, left = random.Random(seed), [], total
    while left > 0:
        n = min(dist.draw(rng), left)
        out.append(n)
        left -= n
    return tuple(out)


def context_lengths(batch: int, dist: Lognormal, seed: int) -> tuple[int, ...]:
    """One context length (cached tokens, the new ones included) per sequence."""
    rng = random.Random(seed)
    return tuple(dist.draw(rng) for _ in range(batch))


@dataclass(frozen=True)
class WorkloadPoint:
    kind: str  # varlen, decode or prefill
    dtype: str
    head_dim: int
    heads: int  # query heads
    gqa: int  # query heads per key/value head
    causal: bool  # bottom-right aligned
    pass_: str  # fwd or fwd+bwd (paged: fwd)
    seqs_q: tuple[int, ...]  # new (query) tokens per sequence
    seqs_kv: tuple[int, ...]  # keys per sequence (paged: the context, new tokens included)
    lengths_seed: int
    length_dist: str  # the distribution the lengths were drawn from, in words
    tokens: int = 0  # varlen: the packed total
    page_size: int = 0  # paged: tokens per page
    chunk: int = 0  # paged: new tokens asked per sequence (decode 1; a short context fewer)

    @property
    def heads_kv(self) -> int:
        return self.heads // self.gqa

    @property
    def batch(self) -> int:
        return len(self.seqs_q)

    @property
    def paged(self) -> bool:
        return self.kind in PAGED

    def key(self) -> str:
        size = f"t{self.tokens}" if self.kind == "varlen" else \
            f"b{self.batch}-p{self.page_size}-c{self.chunk}"
        tail = "" if self.pass_ == "fwd" else "-" + self.pass_.replace("+", "")
        return (f"{self.kind}-{self.dtype}-{'causal' if self.causal else 'full'}"
                f"-d{self.head_dim}-h{self.heads}-g{self.gqa}-{size}-s{self.lengths_seed}{tail}")

    def as_dict(self) -> dict:
        """The row's point fields: the lengths themselves, and the shape columns the
        study's tables share (``seq_q``/``seq_kv``: the longest sequence)."""
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        d["seqs_q"], d["seqs_kv"] = list(self.seqs_q), list(self.seqs_kv)
        return {**d, "batch": self.batch, "heads_kv": self.heads_kv,
                "seq_q": max(self.seqs_q, default=0), "seq_kv": max(self.seqs_kv, default=0),
                "total_q": sum(self.seqs_q), "total_kv": sum(self.seqs_kv)}


def useful_flops(point: WorkloadPoint) -> float:
    """The point's useful-token FLOPs (the one FLOP model's ragged form)."""
    from ..flops import ragged_attention_flops

    return ragged_attention_flops(point.heads, point.seqs_q, point.seqs_kv, point.head_dim,
                                  point.causal, point.pass_)


def bytes_read(point: WorkloadPoint) -> int:
    """A paged call's compulsory bytes: the K and V of every sequence's context (its tokens,
    not the rest of its last page), q and out."""
    elem = 2 if point.dtype in ("float16", "bfloat16") else 4
    kv = 2 * sum(point.seqs_kv) * point.heads_kv * point.head_dim
    qo = 2 * sum(point.seqs_q) * point.heads * point.head_dim
    return elem * (kv + qo)


@dataclass
class Inputs:
    """One point's tensors. q and dout are packed [total_q, Hq, D]; varlen k and v packed
    [total_kv, Hkv, D] with ``cu_k``; paged k and v the caches [num_pages, page_size, Hkv,
    D] with ``page_table`` and ``cache_seqlens``; ``cu_q`` offsets the queries of both."""

    q: object
    k: object
    v: object
    cu_q: object
    cu_k: object = None
    page_table: object = None
    cache_seqlens: object = None
    dout: object = None


def make_inputs(point: WorkloadPoint, seed: int, device) -> Inputs:
    """The point's tensors on ``device``; on "meta", their shapes alone (what a call plans
    from: the compile tests)."""
    import torch

    dtype = getattr(torch, point.dtype)
    if str(device) == "meta":
        def rand(*shape):
            return torch.empty(*shape, device=device, dtype=dtype)
    else:
        gen = torch.Generator(device=device).manual_seed(lengths_seed(seed, point.key()))

        def rand(*shape):
            return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    def offsets(lens):
        return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32,
                            device=device)

    d, hq, hk = point.head_dim, point.heads, point.heads_kv
    q = rand(sum(point.seqs_q), hq, d)
    dout = rand(sum(point.seqs_q), hq, d) if point.pass_ != "fwd" else None
    if not point.paged:
        total = sum(point.seqs_kv)
        return Inputs(q, rand(total, hk, d), rand(total, hk, d), offsets(point.seqs_q),
                      offsets(point.seqs_kv), dout=dout)
    page = point.page_size
    counts = [-(-n // page) for n in point.seqs_kv]
    pages = max(1, sum(counts))
    # Pages handed out in a shuffled order, as a serving engine's allocator leaves them.
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(
        lengths_seed(seed, point.key(), "pages"))).tolist()
    table = torch.zeros(point.batch, max(1, max(counts, default=1)), dtype=torch.int32)
    at = 0
    for b, c in enumerate(counts):
        table[b, :c] = torch.tensor(order[at:at + c], dtype=torch.int32)
        at += c
    return Inputs(q, rand(pages, page, hk, d), rand(pages, page, hk, d), offsets(point.seqs_q),
                  page_table=table.to(device),
                  cache_seqlens=torch.tensor(point.seqs_kv, dtype=torch.int32, device=device),
                  dout=dout)


def ref_heads(point: WorkloadPoint, max_heads: int) -> tuple[int, int]:
    """(query heads, kv heads) the reference covers: whole GQA groups, at least one."""
    hq = max(point.gqa, min(point.heads, max_heads) // point.gqa * point.gqa)
    return hq, hq // point.gqa


def reference(inputs: Inputs, point: WorkloadPoint, max_heads: int, grads: bool = False):
    """(out [total_q, hq, D], (dq, dk, dv) or None) of the float64 reference on the first
    ``ref_heads`` heads of every sequence (``workload_reference``); the gradients by
    autograd through it against ``inputs.dout``, varlen only."""
    from ..workload_reference import paged_reference, varlen_reference

    hq, hk = ref_heads(point, max_heads)
    q = inputs.q.detach()[:, :hq].double()
    if point.paged:
        out, _ = paged_reference(q, inputs.k[:, :, :hk].double(), inputs.v[:, :, :hk].double(),
                                 inputs.page_table, inputs.cache_seqlens,
                                 cu_seqlens_q=inputs.cu_q, causal=point.causal)
        return out, None
    k, v = (t.detach()[:, :hk].double() for t in (inputs.k, inputs.v))
    if grads:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, _ = varlen_reference(q, k, v, inputs.cu_q, inputs.cu_k, causal=point.causal)
    if not grads:
        return out, None
    out.backward(inputs.dout[:, :hq].double())
    return out.detach(), (q.grad, k.grad, v.grad)


@dataclass
class Prepared:
    """A method's call of one point, made ready outside the timed region."""

    call: Callable  # () -> its output, in its own layout: what is timed
    packed: Callable = lambda out: out  # its output as packed [total_q, Hq, D]
    leaves: tuple = ()  # the tensors its backward fills (fwd+bwd): q, k, v as it takes them
    grads: Callable | None = None  # () -> (dq, dk, dv) packed, from ``leaves``' gradients
    dout: object = None  # dO in the call's output layout
    details: dict | None = None  # what it ran, for the row


def leaves_of(inputs: Inputs, backward: bool) -> tuple:
    """q, k, v as fresh leaves (requiring grad for a backward)."""
    return tuple(t.detach().requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))


def padded(packed, lens, length: int):
    """[total, H, D] -> [B, H, length, D], sequence b in rows 0..lens[b]-1, zeros after."""
    out = packed.new_zeros(len(lens), length, *packed.shape[1:])
    at = 0
    for b, n in enumerate(lens):
        out[b, :n] = packed[at:at + n]
        at += n
    return out.transpose(1, 2)


def unpadded(batch, lens):
    """[B, H, L, D] -> packed [total, H, D] (the inverse of ``padded``)."""
    import torch

    return torch.cat([batch[b, :, :n].transpose(0, 1) for b, n in enumerate(lens)])


def gathered(cache, page_table, lens):
    """A paged cache's sequences back to back: packed [sum(lens), H, D]."""
    import torch

    from ..workload_reference import gather_pages

    return torch.cat([gather_pages(cache, page_table, b, n) for b, n in enumerate(lens)])


def padding_mask(point: WorkloadPoint, device, length_q: int, length_k: int):
    """[B, 1, Lq, Lk] bool: each sequence's keys (and causality aligned bottom-right) on the
    padded batch — what a caller without varlen passes SDPA."""
    import torch

    i = torch.arange(length_q, device=device)[:, None]
    j = torch.arange(length_k, device=device)[None, :]
    masks = []
    for sq, sk in zip(point.seqs_q, point.seqs_kv):
        keep = j < sk
        if point.causal:
            keep = keep & (j <= i + sk - sq)
        masks.append(keep)
    return torch.stack(masks)[:, None]
