"""The decode step and the scheduler of :mod:`gfd_bench.serving`: a few Llama-3-8B-shaped decoder
layers with random weights over a paged KV cache laid out as vLLM lays it out, and the Python
bookkeeping a runtime's scheduler does between steps.

Torch is imported by the caller and passed in (``torch``), so that this module imports without
it; the model runs on any device and dtype (bf16 on the GPU, float32 on the CPU for the tests).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shape (Llama-3-8B's by default) and the KV cache's paging."""

    layers: int = 4
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    mlp: int = 14336
    vocab: int = 16384
    page_tokens: int = 16
    rope_theta: float = 500000.0
    eps: float = 1e-5

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads

    def page_bytes(self, itemsize: int) -> int:
        """Bytes of one page of one layer's K (or V): page_tokens x kv_heads x head_dim."""
        return self.page_tokens * self.kv_heads * self.head_dim * itemsize


def pages_per_sequence(shape: ModelShape, context: int, output_len: int) -> int:
    """Pages a sequence of ``context`` prompt tokens needs to generate ``output_len`` more."""
    return -(-(context + output_len) // shape.page_tokens)


class KVCaches:
    """Every layer's K and V cache as vLLM's offloading connector sees them: one int8 tensor
    ``[num_pages, page bytes]`` per layer and K/V (``tensors``: K0, V0, K1, V1, ...), pages of
    ``page_tokens`` tokens. Pages ``[0, batch_pages)`` hold the running batch's sequences; pages
    ``[batch_pages, num_pages)`` are the load region, where prefix-hit loads land and which the
    running batch never reads."""

    def __init__(
        self,
        torch: Any,
        shape: ModelShape,
        batch_pages: int,
        load_pages: int,
        dtype: Any,
        device: Any,
        generator: Optional[Any] = None,
    ) -> None:
        self.shape = shape
        self.dtype = dtype
        self.batch_pages = batch_pages
        self.num_pages = batch_pages + load_pages
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.page_bytes = shape.page_bytes(itemsize)
        self.tensors = []
        for _ in range(2 * shape.layers):
            t = torch.empty((self.num_pages, self.page_bytes), dtype=torch.int8, device=device)
            # Finite values where the batch reads (random bytes could be NaN as bf16); the load
            # region is overwritten by the loads.
            t.view(dtype).normal_(generator=generator)
            self.tensors.append(t)

    def pages(self, t: int) -> Any:
        """Tensor ``t`` as ``[num_pages, page_tokens, kv_heads, head_dim]`` of the model's dtype."""
        s = self.shape
        return (
            self.tensors[t]
            .view(self.dtype)
            .view(self.num_pages, s.page_tokens, s.kv_heads, s.head_dim)
        )

    def slots(self, t: int) -> Any:
        """Tensor ``t`` as ``[num_pages * page_tokens, kv_heads, head_dim]``: one row per token slot."""
        s = self.shape
        return (
            self.tensors[t]
            .view(self.dtype)
            .view(self.num_pages * s.page_tokens, s.kv_heads, s.head_dim)
        )


def paged_attention(
    torch: Any, q: Any, k_pages: Any, v_pages: Any, block_table: Any, mask: Any
) -> Any:
    """Decode attention of one new token per sequence over its pages.

    ``q``: ``[B, heads, head_dim]``; ``k_pages``/``v_pages``: ``[num_pages, page_tokens, kv_heads,
    head_dim]``; ``block_table``: ``[B, P]`` page ids (int64); ``mask``: ``[B, 1, 1, P *
    page_tokens]`` booleans, true where a key position is attended. Returns ``[B, heads,
    head_dim]``.

    The sequences' pages are gathered through the block table into ``[B, kv_heads, T,
    head_dim]``, and grouped-query attention runs as torch's scaled_dot_product_attention with
    the ``group`` query heads of each KV head as its queries (``[B, kv_heads, group,
    head_dim]``): the same arithmetic as ``enable_gqa=True``, without repeating K and V for every
    query head, and with a mask every attention backend takes."""
    b, heads, d = q.shape
    kv_heads = k_pages.shape[2]
    t = block_table.shape[1] * k_pages.shape[1]
    k = k_pages[block_table].view(b, t, kv_heads, d).transpose(1, 2)
    v = v_pages[block_table].view(b, t, kv_heads, d).transpose(1, 2)
    qg = q.view(b, kv_heads, heads // kv_heads, d)  # query head h uses KV head h // group
    o = torch.nn.functional.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
    return o.reshape(b, heads, d)


class DecodeModel:
    """``shape.layers`` decoder layers (RMSNorm, fused QKV, RoPE, paged GQA attention, SwiGLU
    MLP), the final norm and an LM head, with random weights scaled by 1/sqrt(fan-in) so that
    activations stay near unit scale and finite. :meth:`step` is one decode step of a batch: it
    writes each sequence's new K and V into its slot and returns the argmax token per sequence."""

    def __init__(
        self,
        torch: Any,
        shape: ModelShape,
        caches: KVCaches,
        max_positions: int,
        dtype: Any,
        device: Any,
        seed: int = 0,
    ) -> None:
        self.torch, self.shape, self.caches, self.dtype = torch, shape, caches, dtype
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        s = shape

        def weight(out_f: int, in_f: int) -> Any:
            w = torch.randn((out_f, in_f), dtype=torch.float32, device=device, generator=g)
            return w.mul_(1.0 / math.sqrt(in_f)).to(dtype)

        self.embed = torch.randn((s.vocab, s.hidden), dtype=dtype, device=device, generator=g)
        self.layers = []
        for _ in range(s.layers):
            self.layers.append(
                dict(
                    attn_norm=torch.ones(s.hidden, dtype=dtype, device=device),
                    wqkv=weight((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden),
                    wo=weight(s.hidden, s.heads * s.head_dim),
                    mlp_norm=torch.ones(s.hidden, dtype=dtype, device=device),
                    w_gate_up=weight(2 * s.mlp, s.hidden),
                    w_down=weight(s.hidden, s.mlp),
                )
            )
        self.final_norm = torch.ones(s.hidden, dtype=dtype, device=device)
        self.lm_head = weight(s.vocab, s.hidden)
        inv = 1.0 / (
            s.rope_theta
            ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32, device=device) / s.head_dim)
        )
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32, device=device), inv)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)
        self.key_positions = torch.arange(max_positions, dtype=torch.int64, device=device)

    def _norm(self, x: Any, w: Any) -> Any:
        x32 = x.float()
        return (x32 * self.torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.shape.eps)).to(
            self.dtype
        ) * w

    @staticmethod
    def _rope(torch: Any, x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def step(
        self, input_ids: Any, positions: Any, slot_mapping: Any, block_table: Any
    ) -> Tuple[Any, Any]:
        """One decode step: ``input_ids``, ``positions``, ``slot_mapping`` (the token slot
        ``page * page_tokens + offset`` its K and V go to) are ``[B]`` int64, ``block_table``
        ``[B, P]`` int64. Returns (next tokens ``[B]`` int64, logits ``[B, vocab]``). Only
        tensor operations on the inputs' device: capturable as a CUDA graph."""
        torch, s, c = self.torch, self.shape, self.caches
        b = input_ids.shape[0]
        t = block_table.shape[1] * s.page_tokens
        x = self.embed[input_ids]
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        mask = (self.key_positions[:t][None, :] <= positions[:, None])[:, None, None, :]
        linear = torch.nn.functional.linear
        for i, w in enumerate(self.layers):
            h = self._norm(x, w["attn_norm"])
            qkv = linear(h, w["wqkv"])
            q, k, v = qkv.split(
                [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
            )
            q = self._rope(torch, q.view(b, s.heads, s.head_dim), cos, sin)
            k = self._rope(torch, k.view(b, s.kv_heads, s.head_dim), cos, sin)
            c.slots(2 * i).index_copy_(0, slot_mapping, k)
            c.slots(2 * i + 1).index_copy_(0, slot_mapping, v.view(b, s.kv_heads, s.head_dim))
            o = paged_attention(torch, q, c.pages(2 * i), c.pages(2 * i + 1), block_table, mask)
            x = x + linear(o.reshape(b, s.heads * s.head_dim), w["wo"])
            gate, up = linear(self._norm(x, w["mlp_norm"]), w["w_gate_up"]).chunk(2, dim=-1)
            x = x + linear(torch.nn.functional.silu(gate) * up, w["w_down"])
        logits = linear(self._norm(x, self.final_norm), self.lm_head)
        return torch.argmax(logits, dim=-1), logits


# --------------------------------------------------------------------------------------------
# The scheduler


class Request:
    """One running request: its tokens so far and where it is."""

    __slots__ = (
        "request_id",
        "slot",
        "arrival",
        "prompt_len",
        "output",
        "max_output",
        "length",
        "priority",
    )

    def __init__(
        self,
        request_id: int,
        slot: int,
        arrival: int,
        prompt_len: int,
        max_output: int,
        generated: int,
        first_token: int,
    ) -> None:
        self.request_id = request_id
        self.slot = slot  # its row of the batch (and its pages)
        self.arrival = arrival
        self.prompt_len = prompt_len
        self.max_output = max_output
        # The token sampled after the prompt, then one per decode step: the last one is the next
        # step's input, whose K and V are not in the cache yet.
        self.output = [first_token] * (generated + 1)
        self.length = prompt_len + generated  # tokens whose K and V are in the cache
        self.priority = request_id % 3


class Scheduler:
    """The Python work of a runtime's scheduler between two decode steps, on a batch of
    ``batch`` running requests of ``context`` prompt tokens that each generate ``output_len``
    tokens and are then replaced by a new request in the same batch row (and pages): take the
    sampled tokens, advance and finish requests, admit new ones, order the running requests,
    and build the next step's inputs (token ids, positions, slot mapping) as Python lists.

    Batch row ``r`` owns pages ``[r * pages_per_seq, (r + 1) * pages_per_seq)``; the requests
    start at staggered points of their output so that they finish on different steps."""

    def __init__(
        self,
        batch: int,
        context: int,
        output_len: int,
        page_tokens: int,
        pages_per_seq: int,
        vocab: int,
    ) -> None:
        if context < 1 or output_len < 1:
            raise ValueError("context and output_len must be positive")
        if context + output_len > pages_per_seq * page_tokens:
            raise ValueError(
                f"{pages_per_seq} pages of {page_tokens} tokens hold fewer than {context + output_len} tokens"
            )
        self.batch, self.context, self.output_len = batch, context, output_len
        self.page_tokens, self.pages_per_seq, self.vocab = page_tokens, pages_per_seq, vocab
        self.block_table = [
            [r * pages_per_seq + p for p in range(pages_per_seq)] for r in range(batch)
        ]
        self.steps = 0
        self.next_id = 0
        self.finished = 0
        self.running: List[Request] = []
        for r in range(batch):
            self.running.append(self._admit(r, (r * output_len) // batch, first_token=r % vocab))

    def _admit(self, slot: int, generated: int = 0, first_token: int = 0) -> Request:
        req = Request(
            self.next_id, slot, self.steps, self.context, self.output_len, generated, first_token
        )
        self.next_id += 1
        return req

    def update(self, tokens: List[int]) -> None:
        """Takes the step's sampled tokens (one per batch row)."""
        self.steps += 1
        done = []
        for req in self.running:
            tok = tokens[req.slot]
            req.output.append(tok)
            req.length += 1
            if len(req.output) >= req.max_output or req.length >= self.context + self.output_len:
                done.append(req)
        for req in done:
            self.running.remove(req)
            self.finished += 1
            self.running.append(self._admit(req.slot, first_token=req.output[-1]))
        # A runtime orders its running requests every step (priority, then arrival).
        self.running.sort(key=lambda r: (r.priority, r.arrival, r.request_id))

    def inputs(self) -> Tuple[List[int], List[int], List[int]]:
        """The next step's (token ids, positions, slot mapping), one per batch row: each request's
        last token, at position ``length``, its K and V going to that position's slot."""
        ids = [0] * self.batch
        positions = [0] * self.batch
        slots = [0] * self.batch
        pt = self.page_tokens
        for req in self.running:
            pos = req.length
            ids[req.slot] = req.output[-1]
            positions[req.slot] = pos
            slots[req.slot] = self.block_table[req.slot][pos // pt] * pt + pos % pt
        return ids, positions, slots

    def work(self, tokens: List[int], budget_s: float) -> Tuple[List[int], List[int], List[int]]:
        """:meth:`update` and :meth:`inputs`, then Python work until ``budget_s`` has passed
        since the call (the rest of a runtime's scheduling: holding the GIL as it does)."""
        t0 = time.perf_counter()
        self.update(tokens)
        out = self.inputs()
        deadline = t0 + budget_s
        while time.perf_counter() < deadline:
            pass
        return out
