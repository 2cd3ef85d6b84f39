"""TEST DOUBLES of a few vLLM modules, written as files into a temporary package named ``vllm``.

These files are NOT vLLM. tests/vllm_real runs the plugin inside the real vLLM 0.33.0 (its own
venv); these doubles run in the main venv, fast, and reach what a CPU cannot (AITER launches on
gfx942/gfx950, exporters, fail-open paths). Each mirrors only the layout routescope's plugin relies
on, at vLLM 0.33.0's paths (docs/vllm.md, "Binding sites in 0.33.0"):

* the ROCm sparse MLA ops module ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py``: the prefill
  entry, the decode entries ``rocm_sparse_attn_decode`` and ``rocm_sparse_attn_decode_bf16``, the
  split-count helper, the OPUS getter and gate, and (variant ``getters="both"``) the seed PR's gfx942
  getter and inline branch, as tests/vllm_real/seed_gfx942.patch writes them; and the helpers an
  experiment's arm B launches with 0.33.0's signatures (``_rocm_sparse_attn_prefill_ragged_triton``,
  ``_rocm_sparse_attn_prefill_triton``, ``_rocm_sparse_attn_prefill_ragged_aiter_opus``,
  ``build_ragged_indices_from_dense``), each logging its call as ``("helper", name, rows)``;
* the backend ``vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py`` (GLM's path), which imports the
  prefill entry, the bf16 decode and the split-count helper by name;
* the DeepSeek-V4 model modules ``vllm/models/deepseek_v4/amd/rocm.py`` and ``.../deepseek_v41/...``,
  which import the prefill entry and ``rocm_sparse_attn_decode`` by name;
* the forward context, the config getter, the TP rank getter.

Two things are NOT 0.33.0's, kept because the plugin handles them and only a double can show it: the
backend also binds the prefill entry under an alias (``triton_sparse_attn_prefill``: the plugin wraps
any name bound to the function), and ``rocm_sparse_attn_decode_v1`` delegates to another decode entry
(the plugin counts the outermost call). The fixture in conftest.py puts the doubles on sys.path under
the ``vllm.*`` names and removes them afterwards. The attention math is routescope's own torch
reference; the "AITER kernels" are plain functions that log calls.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

HEADER = '"""TEST DOUBLE of vLLM\'s {what}: NOT vLLM. Written by tests/vllm_plugin/doubles.py."""\n'

OPS = '''
import functools

import torch

from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill
from vllm.forward_context import get_forward_context  # noqa: F401  (vLLM's module imports it too)

_ON_GFX942 = False
_ON_GFX950 = False
AITER_ENABLED = True
HAVE_PA = True  # does the (double) AITER build ship pa_prefill_sparse?
HAVE_OPUS = True
_GFX942_AITER_PA_PREFILL_SPARSE_MIN_QUERIES = {gfx942_min}
_GFX950_AITER_SPARSE_PREFILL_OPUS_MIN_QUERIES = 1024
LOG = []  # every call: ("prefill", args, kwargs), ("pa"|"opus"|"intree", rows), ("decode", name, rows)
_HALF = (torch.float16, torch.bfloat16)


def _attend(q, kv, indices, topk_length, scale, attn_sink, out):
    ragged_prefill(KernelArgs(q, kv, SparseIndex(indices, topk_length), float(scale), attn_sink, out))


def pa_prefill_sparse(q, kv, indices, topk_length, scale, *, attn_sink=None, out=None):
    LOG.append(("pa", q.shape[0]))
    _attend(q, kv, indices, topk_length, scale, attn_sink, out)


def pa_sparse_prefill_opus(q, kv, indices, topk_length, scale, *, attn_sink=None, out=None):
    LOG.append(("opus", q.shape[0]))
    _attend(q, kv, indices, topk_length, scale, attn_sink, out)


{getters}


def _can_use_aiter_sparse_prefill_opus(q, kv, attn_sink, output, on_gfx950=None):
    """vLLM 0.33.0 factors its OPUS gate out like this (kv here is [skv, d], the sink sliced to q's heads)."""
    return bool((_ON_GFX950 if on_gfx950 is None else on_gfx950)
                and q.shape[0] >= _GFX950_AITER_SPARSE_PREFILL_OPUS_MIN_QUERIES and q.dtype in _HALF
                and kv.dtype == q.dtype and output.shape == q.shape and attn_sink is not None
                and attn_sink.dtype == torch.float32)


def rocm_sparse_attn_prefill(
    {prefill_params}
) -> None:
    LOG.append(("prefill", (q, kv, indices, topk_length, scale, head_dim), output))
    rows = q.shape[0]
    sink = None if attn_sink is None else attn_sink[: q.shape[1]]
    if _can_use_aiter_sparse_prefill_opus(q, kv.squeeze(1), sink, output):
        fn = _get_aiter_sparse_prefill_opus()
        if fn is not None:
            fn(q, kv, indices, topk_length, scale, attn_sink=attn_sink, out=output)
            return
    if {gfx942_branch} and _ON_GFX942 and rows >= _GFX942_AITER_PA_PREFILL_SPARSE_MIN_QUERIES and q.dtype in _HALF \\
            and kv.dtype == q.dtype:  # the seed's inline gate, as tests/vllm_real/seed_gfx942.patch writes it
        fn = _get_aiter_pa_prefill_sparse()
        if fn is not None:
            fn(q, kv, indices, topk_length, scale, attn_sink=attn_sink, out=output)
            return
    ragged = locals().get("ragged_indices"), locals().get("ragged_indptr")  # absent from the "old" signature
    LOG.append(("intree", rows))
    if indices is None and ragged[0] is not None and ragged[1] is not None:  # 0.33.0's ragged fall-through
        _attend_ragged(q, kv.squeeze(1), ragged[0], ragged[1], scale, sink, output)
        return
    _attend(q, kv, indices, topk_length, scale, attn_sink, output)


def build_ragged_indices_from_dense(indices, lengths, num_rows):
    """vLLM 0.33.0's conversion: a row's first ``lengths`` positions, entries in [0, num_rows) kept."""
    width = indices.shape[-1]
    keep = (torch.arange(width)[None, :] < lengths.long()[:, None]) & (indices >= 0) & (indices < num_rows)
    ptr = torch.zeros(indices.shape[0] + 1, dtype=torch.int32)
    ptr[1:] = keep.sum(dim=1).cumsum(0)
    return indices[keep].to(torch.int32), ptr


def _attend_ragged(q, kv, indices, indptr, scale, attn_sink, out):
    """kv here is [skv, d], as vLLM's helpers take it."""
    ragged_prefill(KernelArgs(q, kv.unsqueeze(1), SparseIndex(None, None, indices.long(), indptr.long()), float(scale),
                              attn_sink, out))


def _rocm_sparse_attn_prefill_ragged_triton(q, kv, indices, indptr, scale, attn_sink, nope_head_dim, rope_head_dim,
                                            out=None):
    LOG.append(("helper", "intree_ragged", q.shape[0]))
    _attend_ragged(q, kv, indices, indptr, scale, attn_sink, out)
    return out


def _rocm_sparse_attn_prefill_triton(q, kv, indices, scale, attn_sink, nope_head_dim, rope_head_dim, topk_length=None,
                                     out=None):
    LOG.append(("helper", "intree_dense", q.shape[0]))
    ragged_prefill(KernelArgs(q, kv.unsqueeze(1), SparseIndex(indices, topk_length), float(scale), attn_sink, out))
    return out


def _rocm_sparse_attn_prefill_ragged_aiter_opus(q, kv, indices, indptr, scale, attn_sink, output) -> bool:
    """0.33.0's OPUS launch: False, having written nothing, when the getter has no kernel."""
    if _get_aiter_sparse_prefill_opus() is None:
        return False
    LOG.append(("helper", "opus", q.shape[0]))
    _attend_ragged(q, kv, indices, indptr, scale, attn_sink, output)
    return True


def rocm_sparse_attn_decode(q, kv_cache=None, *args, output=None, **kwargs) -> None:
    LOG.append(("decode", "rocm_sparse_attn_decode", q.shape[0]))


def rocm_sparse_attn_decode_bf16(q, kv=None, *args, output=None, **kwargs) -> None:
    LOG.append(("decode", "rocm_sparse_attn_decode_bf16", q.shape[0]))
    if output is not None and kwargs.get("ragged_indptr") is not None:  # the split-K math, as 0.33.0's computes it
        _attend_ragged(q, kv.squeeze(1), kwargs["ragged_indices"], kwargs["ragged_indptr"], kwargs["scale"],
                       kwargs.get("attn_sink"), output)


def rocm_sparse_decode_bf16_num_splits(*args, **kwargs) -> int:
    """Not an entry point (it returns a split count); its name shares no prefix with them, as in 0.33.0."""
    return 2


def rocm_sparse_attn_decode_v1(q, kv_cache=None, *args, output=None, **kwargs) -> None:
    """NOT in 0.33.0: a variant delegating to another decode entry (the plugin counts the outermost call)."""
    LOG.append(("decode", "rocm_sparse_attn_decode_v1", q.shape[0]))
    rocm_sparse_attn_decode(q, kv_cache, *args, output=output, **kwargs)
'''

GETTERS = {
    "both": '''
@functools.cache
def _get_aiter_pa_prefill_sparse():
    return pa_prefill_sparse if AITER_ENABLED and HAVE_PA else None


@functools.cache
def _get_aiter_sparse_prefill_opus():
    return pa_sparse_prefill_opus if HAVE_OPUS else None
''',
    "opus_only": '''
@functools.cache
def _get_aiter_sparse_prefill_opus():
    return pa_sparse_prefill_opus if HAVE_OPUS else None
''',
}

PREFILL_PARAMS = {
    "vllm": "q, kv, indices, topk_length, scale, head_dim, nope_head_dim, rope_head_dim, attn_sink, output,\n"
            "    ragged_indices=None, ragged_indptr=None",
    # an older entry without the nope/rope split: the plugin must stand down
    "old": "q, kv, indices, topk_length, scale, head_dim, attn_sink, output",
}

BACKEND = '''
from vllm.forward_context import get_forward_context  # noqa: F401
from vllm.v1.attention.ops.rocm_aiter_mla_sparse import (
    rocm_sparse_attn_decode_bf16,
    rocm_sparse_attn_prefill,
    rocm_sparse_decode_bf16_num_splits,
)
# NOT in 0.33.0: an alias, to show that the plugin wraps any name bound to the function
from vllm.v1.attention.ops.rocm_aiter_mla_sparse import rocm_sparse_attn_prefill as triton_sparse_attn_prefill


def forward_prefill(*args, **kwargs):
    """GLM's path (ROCMAiterMLASparseImpl): the whole batch, decode rows included, to the prefill entry,
    through the name this module bound at import."""
    return rocm_sparse_attn_prefill(*args, **kwargs)


def forward_prefill_aliased(*args, **kwargs):
    return triton_sparse_attn_prefill(*args, **kwargs)


def forward_decode(q):
    """A pure decode when vLLM picks split-K: the bf16 decode entry, with the helper's split count."""
    return rocm_sparse_attn_decode_bf16(q, None, num_splits=rocm_sparse_decode_bf16_num_splits(), output=None)
'''

MODEL = '''
from vllm.forward_context import get_forward_context
from vllm.v1.attention.ops.rocm_aiter_mla_sparse import (
    rocm_sparse_attn_decode,
    rocm_sparse_attn_prefill,
)


def forward_split(q, kv, indices, scale, head_dim, nope_head_dim, rope_head_dim, output, chunk_rows):
    """Shaped like vLLM's DeepSeek-V4 ROCm attention: decode rows to the decode entry, the prefill
    rows after them to the prefill entry in chunks, by keyword. Metadata under key "swa"."""
    md = get_forward_context().attn_metadata["swa"]
    ndt = md.num_decode_tokens
    if md.num_prefills > 0:
        for start in range(ndt, q.shape[0], chunk_rows):
            end = min(start + chunk_rows, q.shape[0])
            rocm_sparse_attn_prefill(
                q=q[start:end], kv=kv, indices=indices[start:end], topk_length=None, scale=scale,
                head_dim=head_dim, nope_head_dim=nope_head_dim, rope_head_dim=rope_head_dim,
                attn_sink=None, output=output[start:end])
    if md.num_decodes > 0:
        rocm_sparse_attn_decode(q[:ndt], None, output=output[:ndt])


def forward_decode(q):
    return rocm_sparse_attn_decode(q, None, output=None)
'''

FORWARD_CONTEXT = '''
from contextlib import contextmanager
from types import SimpleNamespace

_forward_context = None


def get_forward_context():
    assert _forward_context is not None, "Forward context is not set."
    return _forward_context


def is_forward_context_available():
    return _forward_context is not None


@contextmanager
def set_forward_context(attn_metadata):
    """attn_metadata: dict layer name -> metadata (vLLM v1), or a list of such dicts (DBO)."""
    global _forward_context
    prev = _forward_context
    _forward_context = SimpleNamespace(attn_metadata=attn_metadata)
    try:
        yield
    finally:
        _forward_context = prev
'''

CONFIG = '''
from types import SimpleNamespace

SERVED_MODEL_NAME = "double/served-model"
_current = SimpleNamespace(model_config=SimpleNamespace(served_model_name=SERVED_MODEL_NAME, model="double/path"))


def get_current_vllm_config_or_none():
    return _current
'''

DISTRIBUTED = '''
TP_RANK = 0


def get_tensor_model_parallel_rank():
    return TP_RANK
'''

PACKAGES = ("vllm", "vllm/v1", "vllm/v1/attention", "vllm/v1/attention/ops", "vllm/v1/attention/backends",
            "vllm/v1/attention/backends/mla", "vllm/models", "vllm/models/deepseek_v4", "vllm/models/deepseek_v4/amd",
            "vllm/models/deepseek_v41", "vllm/models/deepseek_v41/amd")
# vLLM 0.33.0's modules that bind the ops module's entry points by name (docs/vllm.md), and their doubles
SITES = {
    "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py": ("ROCm sparse MLA backend module (GLM's path)", BACKEND),
    "vllm/models/deepseek_v4/amd/rocm.py": ("DeepSeek-V4 ROCm model module", MODEL),
    "vllm/models/deepseek_v41/amd/rocm.py": ("DeepSeek-V4.1 ROCm model module", MODEL),
}


def write(root: Path, *, getters: str = "both", signature: str = "vllm", gfx942_min: int = 512,
          forward_context: bool = True) -> Path:
    """Write the double package under ``root`` and return ``root`` (put it first on sys.path)."""
    for pkg in PACKAGES:
        d = root / pkg
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").write_text(HEADER.format(what=f"package {pkg.replace('/', '.')}"))
    ops = OPS.format(getters=GETTERS[getters], prefill_params=PREFILL_PARAMS[signature], gfx942_min=gfx942_min,
                     gfx942_branch="True" if getters == "both" else "False")
    if signature == "old":  # the old entry has no nope/rope parameters to log
        ops = ops.replace("LOG.append((\"prefill\", (q, kv, indices, topk_length, scale, head_dim), output))",
                          "LOG.append((\"prefill\", (q, kv), output))")
    files = {
        "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py": ("ROCm sparse MLA ops module", ops),
        **SITES,
        "vllm/config.py": ("config module", CONFIG),
        "vllm/distributed.py": ("distributed module", DISTRIBUTED),
    }
    if forward_context:
        files["vllm/forward_context.py"] = ("forward context module", FORWARD_CONTEXT)
    else:  # the ops double imports it: give it a module without the getter
        files["vllm/forward_context.py"] = ("forward context module, laid out differently", "get_forward_context = None\n")
    for rel, (what, body) in files.items():
        (root / rel).write_text(HEADER.format(what=what) + textwrap.dedent(body))
    return root
