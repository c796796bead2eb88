"""transformers' padding-free (packed) batches through ``tiledattention.sdpa_varlen``.

``DataCollatorWithFlattening`` puts a mini-batch's sequences back to back in one row
(batch size 1) and says where they start in one of two ways, the two
``flash_attention_2`` reads (``modeling_flash_attention_utils._flash_attention_forward``):
- ``cu_seq_lens_q`` / ``cu_seq_lens_k`` / ``max_length_q`` / ``max_length_k`` (with
  ``return_flash_attn_kwargs=True``): used as they are — no host sync, so the step can be
  compiled and captured;
- ``position_ids`` that restart within the row: the offsets are derived from them, as
  transformers' ``prepare_fa_kwargs_from_position_ids`` does (a sequence starts where the
  position is the row's minimum). That needs the number of sequences and the longest one
  on the host: one sync per forward (the result is kept for the other layers, which get the
  same ``position_ids`` tensor), where transformers' flash path syncs in every layer.

The mask. Our mask function is transformers' ``sdpa_mask`` except for a packed row: its
mask is causality (and a sliding window) within each sequence, which ``sdpa_varlen``
computes from the offsets, so no ``[1, 1, T, T]`` mask is built (4 GiB at 64k tokens).
For packed-causal it returns None; with a window it returns a marker (an empty tensor the
attention recognises) carrying the window, so the window reaches the attention even for
models that build a window mask without passing ``sliding_window`` (Doge, PhiMoE). Any
other mask on a packed row (an ``or_mask`` for image tokens, chunked attention, a padding
mask) is built as ``sdpa`` builds it and takes the dense path, exactly.

Under torch.compile, dynamo cannot read a closure's cells, so ``and_masks``' parts are
unknown while tracing and a packed row's mask is built dense, as ``sdpa`` builds it (exact;
O(T^2) memory). transformers marks every cache-less forward as packed while tracing (it
cannot look at ``position_ids``), so a compiled ``use_cache=False`` forward reads a dense
causal mask too, as the built-in ``sdpa`` does; so does a prefill into a cache, as
``sdpa_mask`` builds it while tracing. The attention then never reads ``position_ids`` on
the host under torch.compile (a graph break in every layer).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

_FA_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


@dataclass(frozen=True)
class Packed:
    """The offsets of a packed row, as ``sdpa_varlen`` takes them."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


# --- the mask function -------------------------------------------------------------------

def _mark_window(window: int, device) -> torch.Tensor:
    # The window rides in the shape: a shape is static under torch.compile, where an id()
    # of a tensor made inside the graph is untraceable (a graph break in every layer).
    return torch.empty((0, 0, 0, window), dtype=torch.bool, device=device)


def marked_window(mask) -> int | None:
    """The window a packed-window marker carries; None for any other mask (a real mask
    never has zero batch, heads and queries at once)."""
    if (not isinstance(mask, torch.Tensor) or mask.dim() != 4 or mask.shape[0] != 0
            or mask.shape[1] != 0 or mask.shape[2] != 0):
        return None
    return int(mask.shape[3])


def _and_leaves(fn):
    """The mask functions ``fn`` intersects (``and_masks`` flattened), or ``[fn]``."""
    if getattr(fn, "__qualname__", "") != "and_masks.<locals>.and_mask":
        return [fn]
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return [leaf for part in cells["mask_functions"].cell_contents for leaf in _and_leaves(part)]


def _overlay_window(fn) -> int:
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return int(cells["sliding_window"].cell_contents)


def packed_factory(mask_function) -> tuple[bool, int | None]:
    """(is it causality within packed sequences, its window or None): the factories
    ``create_causal_mask`` / ``create_sliding_window_causal_mask`` build for a packed row
    and nothing else."""
    from transformers.masking_utils import causal_mask_function

    kinds = {"causal": 0, "packed": 0, "window": 0}
    window = None
    for leaf in _and_leaves(mask_function):
        name = getattr(leaf, "__qualname__", "")
        if leaf is causal_mask_function:
            kinds["causal"] += 1
        elif name == "packed_sequence_mask_function.<locals>.inner_mask":
            kinds["packed"] += 1
        elif name == "sliding_window_overlay.<locals>.inner_mask":
            kinds["window"] += 1
            window = _overlay_window(leaf)
        else:
            return False, None
    ok = kinds["causal"] == 1 and kinds["packed"] == 1 and kinds["window"] <= 1
    return ok, window if ok else None


def packed_aware_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                      kv_offset: int = 0, mask_function=None, attention_mask=None, **kwargs):
    """transformers' ``sdpa_mask``, except for a packed row's causal (windowed) mask:
    None, or the window marker (see the module docstring)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask_function = causal_mask_function if mask_function is None else mask_function
    if attention_mask is None and batch_size == 1 and _is_zero(q_offset) and _is_zero(kv_offset):
        packed, window = packed_factory(mask_function)
        if packed:
            if window is None or window >= kv_length:
                return None
            return _mark_window(window, kwargs.get("device", "cpu"))
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
                     mask_function=mask_function, attention_mask=attention_mask, **kwargs)


def _is_zero(offset) -> bool:
    """An offset known to be 0 without reading the device (a StaticCache's is a tensor)."""
    return not isinstance(offset, torch.Tensor) and offset == 0


# --- the offsets -------------------------------------------------------------------------

_LAST: list = [None, -2, None]  # [weakref to position_ids, its _version, Packed | None]


def packed_call(query, key, attention_mask, marked: int | None, kwargs) -> Packed | None:
    """The offsets when this call is one row of packed sequences, else None (the dense
    path); ``marked``: ``marked_window(attention_mask)``. A padding mask wins, as in
    ``flash_attention_2``."""
    if query.shape[0] != 1 or (attention_mask is not None and marked is None):
        return None
    if all(kwargs.get(n) is not None for n in _FA_KWARGS):
        return _from_fa_kwargs(query.device, *(kwargs[n] for n in _FA_KWARGS))
    pos = kwargs.get("position_ids")
    if (pos is None or not isinstance(pos, torch.Tensor) or pos.dim() != 2
            or pos.shape != (1, query.shape[2]) or key.shape[2] != query.shape[2]):
        return None
    return _from_position_ids(pos, query.device)


def _from_fa_kwargs(device, cu_q, cu_k, max_q, max_k) -> Packed:
    def offsets(cu):
        cu = torch.as_tensor(cu)
        return cu.to(device=device, dtype=torch.int32, non_blocking=True)

    # max_length_* are Python ints from the collator; a tensor costs one sync here
    return Packed(offsets(cu_q), offsets(cu_k), int(max_q), int(max_k))


@torch.compiler.disable
def _from_position_ids(pos: torch.Tensor, device) -> Packed | None:
    ref, version, hit = _LAST
    if ref is not None and ref() is pos and version == _version(pos):
        return hit
    result = offsets_of(pos.reshape(-1).cpu(), device)  # the one sync: B sizes cu_seqlens
    _LAST[:] = [weakref.ref(pos), _version(pos), result]
    return result


def offsets_of(flat: torch.Tensor, device) -> Packed | None:
    """The packing of host position ids [T] (sequences start at the row's minimum, as in
    transformers' ``prepare_fa_kwargs_from_position_ids``), or None for one sequence."""
    first = int(flat.min())
    if not bool((flat != torch.arange(flat.numel()) + first).any()):
        return None
    starts = (flat == first).nonzero().flatten()
    if int(starts[0]) != 0:  # a row not starting a sequence is no packing transformers makes
        return None
    cu = torch.cat([starts, torch.tensor([flat.numel()])]).to(torch.int32)
    longest = int(cu.diff().max())
    cu = cu.to(device, non_blocking=True)
    return Packed(cu, cu, longest, longest)


def _version(t: torch.Tensor) -> int | None:
    """The in-place edit counter; inference tensors have none (and a forward's
    position_ids are not edited between its layers)."""
    return None if t.is_inference() else t._version


# --- the call ----------------------------------------------------------------------------

def packed_forward(module, query, key, value, packed: Packed, *, scaling, is_causal,
                   window, softcap, sink):
    """``sdpa_varlen`` on the row's [1, H, T, D] tensors as [T, H, D] views; returns
    [1, T, Hq, D] as transformers' attention functions do."""
    from .. import varlen as _varlen
    from ..errors import InputError

    if sink is not None:
        raise InputError("tiledattention: attention sinks (s_aux) on a packed (padding-free) "
                         "batch are not supported by sdpa_varlen; pad the batch instead")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # views, no copies
    left = -1 if window is None or window >= packed.max_k else int(window) - 1
    window_size = (left, 0 if is_causal else left)  # FA's (W - 1, W - 1), clipped by causal
    out = _varlen.sdpa_varlen(q, k, v, packed.cu_q, packed.cu_k, packed.max_q, packed.max_k,
                              causal=bool(is_causal), scale=scaling, window_size=window_size,
                              softcap=float(softcap or 0.0))
    return out.unsqueeze(0)
