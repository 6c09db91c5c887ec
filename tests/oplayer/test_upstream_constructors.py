"""Code written against upstream TileOPs constructs ops with upstream's constructors: the
attention ops take the shapes and dtype of their calls ahead of the params, the RoPE and
MoE ops take kernel_map (and more) by position. Each op here accepts that form beside its
own (manifest ``upstream:``), checks the shape and dtype arguments against each new call
signature, and refuses upstream-only arguments that would change the result.

The kernels are the recording fake target's (the torch references): what is checked is
what the op layer hands a builder and a kernel, and that both forms hand over the same."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from typing import Any

import pytest
import torch

from tileops import manifest, ops
from tileops.testing import harness

BF16 = torch.bfloat16

# The spec's Python API lines (shared/spec/op-signatures-serving.md, op-signatures.md),
# verbatim: upstream's parameter list of each op.
SPEC = {
    "GroupedQueryAttentionPrefillFwdOp": 'batch, heads, heads_kv, dim, max_seqlen_q, max_seqlen_kv, dtype=torch.float16, is_causal=True, sm_scale=None, softcap=None, window_size_left=-1, window_size_right=-1, backend="auto", validate_uniform_cu_seqlens=True, kernel_map=None, tune=False',  # noqa: E501
    "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp": "batch, heads, heads_kv, max_pages_per_req, page_size, dim, is_causal=True, cache_dtype=None, sm_scale=None, softcap=None, kernel_map=None, tune=False, fuse_rope=False, rope_base=10000.0, max_position=None, rotary_dim=None",  # noqa: E501
    "GroupedQueryAttentionDecodePagedWithKVCacheFwdOp": "batch, heads, heads_kv, seqlen_kv, dim, page_size, sm_scale=None, softcap=None, kernel_map=None, tune=False",  # noqa: E501
    "GroupedQueryAttentionSlidingWindowFwdOp": "batch, heads, heads_kv, seq_len, dim, is_causal=True, window_size_left=-1, window_size_right=-1, kernel_map=None, tune=False",  # noqa: E501
    "GroupedQueryAttentionSlidingWindowVarlenFwdOp": "batch, heads, heads_kv, dim, is_causal=True, window_size_left=-1, window_size_right=-1, accum_dtype=torch.float32, kernel_map=None, tune=False",  # noqa: E501
    "FusedTopKOp": 'num_tokens=None, num_experts=None, top_k=None, scoring_func="softmax", renormalize=False, kernel_map=None, config=None',  # noqa: E501
    "FusedMoeFwdOp": 'num_tokens, num_experts, top_k, hidden_size, ffn_size, scoring_func="softmax", renormalize=False, routed_scaling_factor=1.0, expert_map=None, num_experts_local=None, prepare_finalize=None, experts=None, kernel_map=None, *, activation="silu_and_mul"',  # noqa: E501
    "RopeNeoxFwdOp": 'layout="1d", base=10000.0, kernel_map=None, tune=False',
    "RopeNonNeoxFwdOp": 'layout="1d", base=10000.0, kernel_map=None, tune=False',
    "RopeLlama31FwdOp": 'layout="1d", base=10000.0, scale_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192, kernel_map=None, tune=False',  # noqa: E501
    "RopeYarnFwdOp": 'layout="1d", base=10000.0, scale=16.0, original_max_position=4096, beta_fast=32.0, beta_slow=1.0, attn_factor=1.0, kernel_map=None, tune=False',  # noqa: E501
    "RopeLongRopeFwdOp": 'layout="1d", base=10000.0, rescale_factors=None, max_position_embeddings=4096, original_max_position_embeddings=4096, kernel_map=None, tune=False',  # noqa: E501
}
# Ops whose own constructor is upstream's (op-signatures.md, "From the source").
OWN = {
    "GroupedQueryAttentionFwdOp": "batch, heads, heads_kv, seq_len, dim, is_causal=True, sm_scale=None, softcap=None",  # noqa: E501
    "GroupedQueryAttentionDecodeWithKVCacheFwdOp": "batch, heads, heads_kv, seqlen_kv, dim, sm_scale=None, softcap=None",  # noqa: E501
}


def parameters(text: str) -> list[tuple[str, Any, bool]]:
    """(name, default, keyword-only) of a parameter list, defaults as written."""
    args = ast.parse(f"def f({text}): pass").body[0].args
    defaults = [None] * (len(args.args) - len(args.defaults)) + args.defaults
    out = [(a.arg, d and ast.unparse(d), False) for a, d in zip(args.args, defaults)]
    return out + [(a.arg, d and ast.unparse(d), True) for a, d in zip(args.kwonlyargs, args.kw_defaults)]


def upstream_parameters(upstream: manifest.Upstream) -> list[tuple[str, Any, bool]]:
    out = []
    for name in upstream.names:  # the signature goes on with ours, by keyword
        p = upstream.signature.parameters[name]
        out.append((p.name, written(p.default), p.kind is p.KEYWORD_ONLY))
    return out


def written(default: Any) -> str | None:
    """A default as the spec writes it (torch.float16, 'auto', None for no default)."""
    if default is inspect.Parameter.empty:
        return None
    return str(default) if isinstance(default, torch.dtype) else repr(default)


def normalised(params: list[tuple[str, Any, bool]]) -> list[tuple[str, Any, bool]]:
    return [(n, None if d is None else d.replace('"', "'"), k) for n, d, k in params]


@pytest.mark.parametrize("op", sorted(SPEC))
def test_each_op_declares_upstreams_constructor_as_the_spec_writes_it(op):
    upstream = manifest.entry(op).upstream
    assert upstream is not None and upstream.signature is not None
    assert normalised(upstream_parameters(upstream)) == normalised(parameters(SPEC[op]))


@pytest.mark.parametrize("op", sorted(OWN))
def test_the_dense_attention_ops_own_constructor_is_upstreams(op):
    signature = inspect.signature(getattr(ops, op).__init__)
    ours = [
        (p.name, written(p.default), False)
        for p in signature.parameters.values()
        if p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self"
    ]
    assert ours == normalised(parameters(OWN[op]))


# --- the serving attention ops, both forms, on one set of inputs ------------------------

B, H, HKV, D = 2, 4, 2, 16


@dataclasses.dataclass(frozen=True)
class Form:
    op: str
    shapes: dict[str, tuple[int, ...] | None]
    params: dict[str, Any]  # the manifest params the inputs are made for
    upstream: tuple[tuple, dict]  # (args, kwargs) as upstream's API writes them
    ours: tuple[tuple, dict]
    dims: dict[str, int]  # upstream's shape arguments, as passed

    def inputs(self) -> list[torch.Tensor | None]:
        case = harness.Case(self.op, "upstream-form", dict(self.shapes), dict(self.params), BF16, None, "cpu")
        return harness.make_inputs(case, torch.Generator().manual_seed(7))

    def build(self, which: str, target: str, **change: Any):
        args, kwargs = self.upstream if which == "upstream" else self.ours
        if change:  # replace upstream's shape arguments by name, keeping their positions
            names = list(manifest.entry(self.op).upstream.signature.parameters)
            args = tuple(change.get(n, a) for n, a in zip(names, args))
        return getattr(ops, self.op)(*args, **kwargs, target=target)


T, TK, PAGE, PAGES = 10, 12, 4, 3  # packed rows; a page of 4 rows, 3 pages a request
FORMS = [
    Form(
        "GroupedQueryAttentionPrefillFwdOp",
        {
            "q": (T, H, D),
            "k": (TK, HKV, D),
            "v": (TK, HKV, D),
            "cu_seqlens_q": (B + 1,),
            "cu_seqlens_kv": (B + 1,),
        },
        {"max_seqlen_q": 8, "max_seqlen_kv": 12},
        (
            (B, H, HKV, D, 8, 12),
            {"dtype": BF16, "is_causal": True, "softcap": 30.0, "window_size_left": 5},
        ),
        ((8, 12, True, None, 30.0, 5), {}),
        {"batch": B, "heads": H, "heads_kv": HKV, "dim": D},
    ),
    Form(
        "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp",
        {
            "q": (T, H, D),
            "k_new": (T, HKV, D),
            "v_new": (T, HKV, D),
            "k_pages": (B * PAGES * PAGE, HKV, D),
            "v_pages": (B * PAGES * PAGE, HKV, D),
            "k_scale": None,
            "v_scale": None,
            "cu_seqlens_q": (B + 1,),
            "cache_seqlens": (B,),
            "block_table": (B, PAGES),
        },
        {"max_pages_per_req": PAGES, "page_size": PAGE, "max_seqlen_q": PAGES * PAGE},
        ((B, H, HKV, PAGES, PAGE, D), {"is_causal": True, "cache_dtype": BF16, "softcap": 30.0}),
        ((PAGES, PAGE, PAGES * PAGE, True, None, 30.0), {}),
        {"batch": B, "heads": H, "heads_kv": HKV, "dim": D},
    ),
    Form(
        "GroupedQueryAttentionDecodePagedWithKVCacheFwdOp",
        {
            "q": (B, H, D),
            "k": (B * PAGES * PAGE, HKV, D),
            "v": (B * PAGES * PAGE, HKV, D),
            "real_seqlen_kv": (B,),
            "block_table": (B, PAGES),
        },
        {"page_size": PAGE},
        ((B, H, HKV, B * PAGES * PAGE, D, PAGE), {"softcap": 30.0}),
        ((PAGE,), {"softcap": 30.0}),
        {"batch": B, "heads": H, "heads_kv": HKV, "seqlen_kv": B * PAGES * PAGE, "dim": D},
    ),
    Form(
        "GroupedQueryAttentionSlidingWindowFwdOp",
        {"q": (B, 6, H, D), "k": (B, 6, HKV, D), "v": (B, 6, HKV, D)},
        {},
        ((B, H, HKV, 6, D), {"is_causal": True, "window_size_left": 2}),
        ((True, 2), {}),
        {"batch": B, "heads": H, "heads_kv": HKV, "seq_len": 6, "dim": D},
    ),
    Form(
        "GroupedQueryAttentionSlidingWindowVarlenFwdOp",
        {
            "q": (T, H, D),
            "k": (TK, HKV, D),
            "v": (TK, HKV, D),
            "cu_seqlens_q": (B + 1,),
            "cu_seqlens_k": (B + 1,),
        },
        {"max_seqlen_q": T},
        ((B, H, HKV, D, False, 3, 2), {}),
        ((False, 3, 2), {"max_seqlen_q": T}),
        {"batch": B, "heads": H, "heads_kv": HKV, "dim": D},
    ),
]
BY_OP = {f.op: f for f in FORMS}


def fresh(inputs: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Copies, as paged prefill writes into its cache."""
    return [None if t is None else t.clone() for t in inputs]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.op)
def test_an_op_built_as_upstream_writes_it_computes_what_our_form_computes(form, cpu_target):
    inputs = form.inputs()
    theirs = form.build("upstream", cpu_target.name)(*fresh(inputs))
    ours = form.build("ours", cpu_target.name)(*fresh(inputs))
    torch.testing.assert_close(theirs, ours, rtol=0, atol=0)
    (_, upstream_params), (_, our_params) = cpu_target.builds_of(form.op)
    assert upstream_params == our_params  # a builder cannot tell the forms apart


@pytest.mark.parametrize(("form", "name"), [(f, n) for f in FORMS for n in f.dims], ids=lambda x: getattr(x, "op", x))
def test_a_call_that_contradicts_an_upstream_shape_argument_is_refused_naming_it(form, name, cpu_target):
    wrong = 2 * form.dims[name]
    op = form.build("upstream", cpu_target.name, **{name: wrong})
    with pytest.raises(ValueError) as info:
        op(*form.inputs())
    text = str(info.value)
    assert text.startswith(f"{form.op}: constructed with {name}={wrong}, but this call has ")
    assert f"= {form.dims[name]}. Construct the op with {name}={form.dims[name]}, or pass inputs" in text
    assert cpu_target.builds == []


def test_a_shape_argument_is_checked_on_a_miss_only_as_shapes_are_in_the_memo_key(cpu_target):
    form = BY_OP["GroupedQueryAttentionDecodePagedWithKVCacheFwdOp"]
    op = form.build("upstream", cpu_target.name)
    inputs = form.inputs()
    op(*inputs)
    op(*inputs)
    stats = op.kernel_cache_stats()
    assert (stats["misses"], stats["hits"]) == (1, 1)


def test_upstreams_dtype_argument_must_be_the_calls_dtype_float16_by_default(cpu_target):
    form = BY_OP["GroupedQueryAttentionPrefillFwdOp"]
    (args, kwargs) = form.upstream
    default = ops.GroupedQueryAttentionPrefillFwdOp(*args, target=cpu_target.name)  # dtype=torch.float16
    with pytest.raises(ValueError) as info:
        default(*form.inputs())
    assert str(info.value) == (
        "GroupedQueryAttentionPrefillFwdOp: constructed with dtype=torch.float16, but this call's "
        "q is torch.bfloat16. Construct the op with dtype=torch.bfloat16, or pass torch.float16 "
        "inputs"
    )
    paged = BY_OP["GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp"]
    op = ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(
        *paged.upstream[0], cache_dtype=torch.float16, target=cpu_target.name
    )
    with pytest.raises(ValueError, match=r"constructed with cache_dtype=torch.float16, but this call's k_pages is"):
        op(*paged.inputs())
    assert cpu_target.builds == []


@pytest.mark.parametrize(
    ("op", "args", "kwargs", "refused"),
    [
        (
            "GroupedQueryAttentionPrefillFwdOp",
            (B, H, HKV, D, 8, 8),
            {"dtype": torch.float8_e4m3fn},
            "dtype=torch.float8_e4m3fn is not served here",
        ),
        (
            "GroupedQueryAttentionPrefillFwdOp",
            (B, H, HKV, D, 8, 8),
            {"backend": "fp8"},
            "upstream's backend='fp8'",
        ),
        (
            "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp",
            (B, H, HKV, PAGES, PAGE, D),
            {"cache_dtype": torch.float8_e4m3fn},
            "cache_dtype=torch.float8_e4m3fn is not served here",
        ),
        (
            "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp",
            (B, H, HKV, PAGES, PAGE, D, True, None, None, None, None, False, True),
            {},
            "upstream's fuse_rope=True",
        ),
        (
            "GroupedQueryAttentionSlidingWindowVarlenFwdOp",
            (B, H, HKV, D),
            {"accum_dtype": torch.float16},
            "upstream's accum_dtype=torch.float16",
        ),
        (
            "FusedMoeFwdOp",
            (4, 8, 2, 16, 8),
            {"expert_map": torch.arange(8)},
            "upstream's expert_map=tensor(",
        ),
        (
            "FusedMoeFwdOp",
            (4, 8, 2, 16, 8),
            {"num_experts_local": 4},
            "upstream's num_experts_local=4",
        ),
    ],
    ids=lambda x: x if isinstance(x, str) and x.endswith("Op") else None,
)
def test_an_upstream_argument_that_would_change_the_result_is_refused_at_construction(op, args, kwargs, refused):
    with pytest.raises(ValueError) as info:
        getattr(ops, op)(*args, **kwargs)
    assert str(info.value).startswith(f"{op}: ") and refused in str(info.value)
    assert "Pass one of those" in str(info.value) or "pass one of those" in str(info.value)


def test_upstream_knobs_that_compute_the_same_are_accepted(cpu_target):
    form = BY_OP["GroupedQueryAttentionPrefillFwdOp"]
    args, kwargs = form.upstream
    want = form.build("ours", cpu_target.name)(*form.inputs())
    for backend in ("auto", "dense", "varlen", "sliding_window"):
        for validate in (True, False):
            op = ops.GroupedQueryAttentionPrefillFwdOp(
                *args,
                **kwargs,
                backend=backend,
                tune=True,
                validate_uniform_cu_seqlens=validate,
                target=cpu_target.name,
            )
            torch.testing.assert_close(op(*form.inputs()), want, rtol=0, atol=0)
    paged = BY_OP["GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp"]
    ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(*paged.upstream[0], rope_base=5e5, max_position=4096)


def test_upstreams_trailing_forward_arguments_are_accepted(cpu_target):
    for name in (
        "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp",
        "GroupedQueryAttentionSlidingWindowVarlenFwdOp",
    ):
        form = BY_OP[name]
        inputs = form.inputs()
        op = form.build("upstream", cpu_target.name)
        torch.testing.assert_close(op(*fresh(inputs), 8), op(*fresh(inputs)), rtol=0, atol=0)


def test_our_positional_forms_that_look_like_upstreams_stay_ours():
    # the transformers integration's calls: a bool or None sits among the leading ints
    prefill = ops.GroupedQueryAttentionPrefillFwdOp(8, 12, True, None, None, 4, -1)
    paged = ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(3, 16, 12, True, 0.125, None, -1)
    short = ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(2, 16, 2)
    decode = ops.GroupedQueryAttentionDecodePagedWithKVCacheFwdOp(16, None, 30.0, 7)
    for op in (prefill, paged, short, decode):
        assert op.extras == {}  # no upstream shape argument to check
    assert prefill.params["window_size_left"] == 4 and paged.params["sm_scale"] == 0.125
    assert short.params["max_seqlen_q"] == 2 and decode.params["window_size_left"] == 7


def test_an_incomplete_upstream_form_names_what_is_missing_and_the_form():
    with pytest.raises(TypeError) as info:
        ops.GroupedQueryAttentionPrefillFwdOp(B, H, HKV, D, 8)
    text = str(info.value)
    assert "max_seqlen_kv" in text and "upstream TileOPs' form GroupedQueryAttentionPrefillFwdOp(batch, heads" in text
    with pytest.raises(ValueError, match=r"heads must be a positive int \(upstream's shape argument"):
        ops.GroupedQueryAttentionDecodePagedWithKVCacheFwdOp(B, 0, HKV, 48, D, PAGE)


def test_our_params_upstream_lacks_are_taken_by_keyword_in_upstreams_form(cpu_target):
    form = BY_OP["GroupedQueryAttentionDecodePagedWithKVCacheFwdOp"]
    op = ops.GroupedQueryAttentionDecodePagedWithKVCacheFwdOp(*form.upstream[0], window_size_left=3)
    assert op.params["window_size_left"] == 3 and op.extras["seqlen_kv"] == B * PAGES * PAGE
    paged = ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(B, H, HKV, PAGES, PAGE, D)
    assert paged.params["max_seqlen_q"] == PAGES * PAGE  # upstream passes it to forward(); a chunk fits its pages


def test_a_compiled_call_is_checked_against_upstreams_arguments_as_an_eager_one(cpu_target):
    form = BY_OP["GroupedQueryAttentionSlidingWindowFwdOp"]
    right = form.build("upstream", cpu_target.name)
    wrong = form.build("upstream", cpu_target.name, seq_len=12)
    inputs = form.inputs()
    eager = right(*inputs)
    torch.testing.assert_close(torch.compile(right, fullgraph=True, backend="eager")(*inputs), eager)
    with pytest.raises(ValueError, match=r"constructed with seq_len=12, but this call has q.shape\[1\] = 6"):
        torch.compile(wrong, fullgraph=True, backend="eager")(*inputs)


# --- RoPE and MoE: upstream's trailing kernel_map, tune and hooks by position --------------


def test_rope_ops_take_kernel_map_and_tune_by_position_as_upstream(cpu_target):
    x = torch.randn(6, 8)
    cases = {
        "RopeNeoxFwdOp": ("1d", 500.0),
        "RopeNonNeoxFwdOp": ("1d", 500.0),
        "RopeLlama31FwdOp": ("1d", 500.0, 4.0, 1.0, 4.0, 64),
        "RopeYarnFwdOp": ("1d", 500.0, 4.0, 64, 32.0, 1.0, 1.2),
        "RopeLongRopeFwdOp": ("1d", 500.0, torch.ones(4), 8192, 4096),
    }
    for name, lead in cases.items():
        cls = getattr(ops, name)
        theirs = cls(*lead, None, True, target=cpu_target.name)
        ours = cls(*lead, target=cpu_target.name)
        assert theirs.params == ours.params and theirs.tune
        torch.testing.assert_close(theirs(x), ours(x), rtol=0, atol=0)


def test_moe_ops_take_upstreams_trailing_arguments_by_position(cpu_target):
    logits = torch.randn(3, 8)
    topk = ops.FusedTopKOp(None, 8, 2, "softmax", True, None, {"block": 64}, target=cpu_target.name)
    assert topk.params == ops.FusedTopKOp(num_experts=8, top_k=2, renormalize=True).params
    w, ids = topk(logits)
    assert ids.shape == (3, 2)
    e, h, f = 4, 8, 6
    moe = ops.FusedMoeFwdOp(
        2,
        e,
        2,
        h,
        f,
        "softmax",
        True,
        1.0,
        None,
        None,
        None,
        None,
        None,
        activation="gelu_and_mul",
        target=cpu_target.name,
    )
    ours = ops.FusedMoeFwdOp(2, e, 2, h, f, "softmax", True, 1.0, activation="gelu_and_mul", target=cpu_target.name)
    assert moe.params == ours.params
    weights = (torch.randn(e, 2 * f, h).bfloat16(), torch.randn(e, h, f).bfloat16())
    args = (torch.randn(2, h).bfloat16(), torch.randn(2, e), *weights)
    torch.testing.assert_close(moe(*args), ours(*args), rtol=0, atol=0)


# --- the other ops: the spec's Python API lines are our own constructors -------------------


@pytest.mark.parametrize(
    ("op", "args", "kwargs"),
    [
        ("RMSNormFwdOp", ((64,), 1e-6), {}),
        ("FusedAddRMSNormFwdOp", (1e-6,), {}),
        ("LayerNormFwdOp", ((64,), 1e-5), {}),
        ("GroupNormFwdOp", (4, 1e-5), {}),
        ("FusedAddLayerNormFwdOp", (1e-5,), {}),
        ("SoftmaxFwdOp", (-1,), {}),
        ("LogSoftmaxFwdOp", (-1,), {}),
        ("SumFwdOp", (0, True), {}),
        ("MeanFwdOp", (None, False), {}),
        ("AmaxFwdOp", ((0, 1), False), {}),
        ("GemmFwdOp", (False, True), {}),
        ("BmmFwdOp", (), {}),
        ("AddFwdOp", (), {"alpha": 2}),
        ("GeluAndMulFwdOp", (), {"kernel_map": None, "tune": False}),
        ("GeluTanhAndMulFwdOp", (), {}),
        ("RopeNeoxFwdOp", ("2d", 10000.0), {}),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_the_other_spec_python_api_lines_construct_as_written(op, args, kwargs):
    assert getattr(ops, op)(*args, **kwargs).params is not None
