"""Static-cache decoding for the plain-torch decoder: fixed buffers, one step per batch-size bucket,
replayed as a CUDA graph on CUDA.

Eager decoding launches every kernel of every layer from Python at each token: for a 0.5B model on a
GPU that launch overhead, not the weights' bandwidth, sets the speed. Here the keys/values of every row
live in preallocated buffers ([rows, H_kv, L, D] per layer: the row's prompt in columns [0, P), its
completion from column P on) and a decode step only reads and writes fixed tensors: the input tokens,
the positions, the column written this step and a boolean attention mask. So the step can be captured
once per (bucket of rows, cache length) as a `torch.cuda.CUDAGraph` and replayed per token. On CPU
the same step runs eagerly over the same buffers (tests pin it to the dynamic path's samples).

Rows are bucketed to powers of two; rows beyond the live ones are dummies that attend to column 0 and
whose logits are ignored. When rows finish, `retain` moves the live rows to the front of the buffers
and the step of a smaller bucket runs. The buffers (and graphs) outlive one `generate` call, so a
run's next call with the same shapes replays the same graphs; their length is rounded up to a
multiple of `LENGTH_STEP` for that. Graphs are captured against the weights' storage: a model whose
parameters are replaced (not updated in place) gets new graphs.

Unlike the dynamic path, each row holds its own copy of its prompt's keys/values (G copies per group):
the step reads them once per row instead of once per group, which costs bandwidth for long prompts
and large groups but keeps every shape static.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from textzoo.decoding.fastlm import FastDecoder, Prefix, SharedRows

LENGTH_STEP = 128
"""Cache lengths are rounded up to a multiple of this, so that calls of similar size share graphs."""
MODES = ("auto", "dynamic", "static", "graph")
"""How the plain decoder decodes: "dynamic" (growing cache, grouped prompts), "static" (this module,
eager), "graph" (this module, CUDA graphs; CUDA only), "auto" (graph on CUDA, else dynamic)."""


def bucket(rows: int) -> int:
    """The number of rows a step runs for ``rows`` live rows: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


class StaticCache:
    """Keys/values of every layer and the step's inputs for up to ``rows`` rows of ``length`` columns."""

    def __init__(
        self, layers: int, rows: int, kv_heads: int, length: int, head_dim: int, dtype: torch.dtype, device
    ) -> None:
        shape = (rows, kv_heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.mask = torch.zeros((rows, 1, 1, length), dtype=torch.bool, device=device)  # True = attend
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)  # [rows] this step's input
        self.position = torch.zeros(rows, dtype=torch.long, device=device)  # [rows] this step's position
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # the cache column written this step
        self.graphs: dict[int, tuple[Callable[[], None], torch.Tensor]] = {}  # bucket -> replay, logits
        self.weights: tuple[int, ...] = ()  # storage of the weights the graphs were captured with

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        return self.mask.shape[-1]

    def fits(self, rows: int, length: int, dtype: torch.dtype, device: torch.device) -> bool:
        k = self.keys[0]
        return self.rows >= rows and self.length >= length and k.dtype == dtype and k.device == device

    def set_dummies(self, start: int, stop: int) -> None:
        """Rows [start, stop) of a bucket are dummies: they attend to column 0 only (no NaN), position 0."""
        self.mask[start:stop] = False
        self.mask[start:stop, ..., 0] = True
        self.tokens[start:stop] = 0
        self.position[start:stop] = 0


class StaticDecoding:
    """Rows decoding over a `StaticCache`: eager steps, or CUDA-graph replays when ``graphs``."""

    def __init__(
        self,
        decoder: FastDecoder,
        cache: StaticCache,
        prefix: Prefix,
        rows: SharedRows,
        last: torch.Tensor,
        graphs: bool,
    ) -> None:
        self.decoder, self.cache, self.use_graphs = decoder, cache, graphs
        S, P = len(rows.inverse), prefix.bias.shape[-1]
        self.live = S  # rows in use (at the front of the buffers)
        self.size = bucket(S)  # rows a step runs
        self.logits = decoder.head(last)[rows.inverse]  # [S, V] the first token's, once per distinct prompt
        self.features = last[rows.inverse]  # [S, d]
        # each row gets its own copy of its prompt's keys/values; later columns are masked until written
        inverse = rows.inverse
        for i in range(len(decoder.layers)):
            cache.keys[i][:S, :, :P] = prefix.keys[i].index_select(0, inverse)
            cache.values[i][:S, :, :P] = prefix.values[i].index_select(0, inverse)
        cache.mask[:S] = False
        cache.mask[:S, ..., :P] = prefix.bias.index_select(0, inverse) == 0  # the prompt's real tokens
        cache.position[:S] = prefix.lengths.index_select(0, inverse)
        cache.column.fill_(P)
        cache.set_dummies(S, self.size)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        cache, n = self.cache, self.live
        cache.tokens[:n] = tokens
        if self.use_graphs:
            logits = self._graph(self.size)
        else:
            logits = _step(self.decoder, cache, self.size)  # [size, V]
        cache.position[:n] += 1
        cache.column += 1
        return logits[:n]  # valid until the next step (a graph's output buffer)

    def retain(self, rows: torch.Tensor) -> torch.Tensor:
        """Move ``rows`` (sorted) to the front of the buffers; the step of their bucket runs from now on."""
        cache, n = self.cache, len(rows)
        if n == self.live:
            return rows
        for store in (cache.keys, cache.values):
            for t in store:
                t[:n] = t[: self.live].index_select(0, rows)
        cache.mask[:n] = cache.mask[: self.live].index_select(0, rows)
        cache.position[:n] = cache.position[: self.live].index_select(0, rows)
        self.live, self.size = n, bucket(n)
        cache.set_dummies(n, self.size)
        return rows

    def _graph(self, size: int) -> torch.Tensor:
        """Replay the captured step of ``size`` rows (capturing it first); its logits buffer ([size, V])."""
        cache = self.cache
        if size not in cache.graphs:
            cache.graphs[size] = capture_graph(lambda: _step(self.decoder, cache, size))
        replay, logits = cache.graphs[size]
        replay()
        return logits


def graphs_available(device: torch.device) -> bool:
    """Whether decode steps on ``device`` can be captured as CUDA graphs."""
    return device.type == "cuda"


def capture_graph(step, warmup: int = 2) -> tuple[Callable[[], None], torch.Tensor]:
    """Capture ``step()`` (which reads and writes fixed buffers and returns a tensor) as a CUDA graph:
    ``(replay, output)``, where each ``replay()`` reruns it and leaves its result in ``output``.

    The warm-up runs (kernel selection, cuBLAS workspaces) execute ``step`` for real, so its writes
    must be ones the first replay repeats (a decode step writes the column it is about to write).
    """
    # Under autocast, cached casts of the weights would be freed when the autocast region ends while
    # the graph still read them: capture with the cache off, so the graph casts the weights itself.
    uncached = torch.autocast(
        "cuda",
        dtype=torch.get_autocast_dtype("cuda"),
        enabled=torch.is_autocast_enabled("cuda"),
        cache_enabled=False,
    )
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), uncached:
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), uncached:
        output = step()
    return graph.replay, output


def _step(decoder: FastDecoder, cache: StaticCache, size: int) -> torch.Tensor:
    """One token for the first ``size`` rows of ``cache`` (every shape fixed): the next logits ([size, V]).

    Writes each layer's new key/value at ``cache.column`` and unmasks that column first, so the token
    attends to the prompt, the completion so far and itself.
    """
    mask = cache.mask[:size]  # [size, 1, 1, L]
    mask.index_fill_(-1, cache.column, True)
    gqa = decoder.kv_heads != decoder.heads

    def attend(i, q, k, v, scale):  # q [size, 1, H, D], k/v [size, 1, H_kv, D] -> [size, 1, H*D]
        keys, values = cache.keys[i][:size], cache.values[i][:size]  # [size, H_kv, L, D]
        keys.index_copy_(2, cache.column, k.transpose(1, 2).to(keys.dtype))
        values.index_copy_(2, cache.column, v.transpose(1, 2).to(values.dtype))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask, scale=scale, enable_gqa=gqa
        )  # [size, H, 1, D]
        return out.transpose(1, 2).reshape(size, 1, -1)

    hidden = decoder.arch.forward(decoder, cache.tokens[:size, None], cache.position[:size, None], attend)
    return decoder.head(decoder.norm(hidden[:, -1]))  # [size, V]
