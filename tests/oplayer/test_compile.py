"""The compile boundary (E7): every tracer sees one opaque tileops custom op per call,
with a fake derived from the manifest; no tracer ever builds or runs a kernel."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from tileops.ops import ALL_OPS, RMSNormFwdOp, SiluFwdOp
from tileops.testing import harness


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # every test compiles the same lambda code objects
    yield
    torch._dynamo.reset()


def first_case(cls):
    return harness.cases("fake_cpu", ops=[cls.__name__], edge_cases=False)[0]


def op_and_inputs(cls):
    case = first_case(cls)
    return cls(**harness.constructor_args(case)), harness.make_inputs(case), case


def tileops_calls(graph: torch.fx.Graph) -> list[str]:
    return [
        str(node.target)
        for node in graph.nodes
        if node.op == "call_function" and str(node.target).startswith("tileops.")
    ]


def small_case_inputs(cls):
    """The first workload, shrunk so that eager-vs-compiled comparisons stay quick."""
    op, inputs, case = op_and_inputs(cls)
    return op, inputs


@pytest.mark.parametrize("cls", ALL_OPS, ids=lambda c: c.__name__)
def test_fullgraph_compile_over_every_op_matches_eager(cls, cpu_target):
    op, inputs = small_case_inputs(cls)
    expected = op(*[None if t is None else t.clone() for t in inputs])
    compiled = torch.compile(lambda *xs: op(*xs), fullgraph=True, backend="aot_eager")
    got = compiled(*[None if t is None else t.clone() for t in inputs])
    for a, b in zip(
        got if isinstance(got, tuple) else (got,),
        expected if isinstance(expected, tuple) else (expected,),
    ):
        torch.testing.assert_close(a, b)


def test_inductor_compiles_an_op_into_a_larger_graph(cpu_target):
    op = RMSNormFwdOp(normalized_shape=(64,))
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    compiled = torch.compile(lambda x, w: op(x * 2, w) + 1, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), op(x * 2, w) + 1)


def test_a_dimension_marked_dynamic_stays_symbolic_through_the_fake(cpu_target):
    """vLLM marks the token count dynamic and traces once: the fake must not turn the
    symbolic size into an int (that specialises it and dynamo refuses the graph)."""
    op = RMSNormFwdOp(normalized_shape=(64,))
    w = torch.randn(64, dtype=torch.bfloat16)
    compiled = torch.compile(lambda x: op(x, w) * 2, fullgraph=True, backend="aot_eager")
    for tokens in (7, 9, 33):
        x = torch.randn(tokens, 64, dtype=torch.bfloat16)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), op(x, w) * 2)


@pytest.mark.parametrize("cls", ALL_OPS, ids=lambda c: c.__name__)
def test_make_fx_records_the_custom_op_and_builds_nothing(cls, meta_target):
    op, inputs, _ = op_and_inputs(cls)
    graph = make_fx(lambda *xs: op(*xs), tracing_mode="fake")(*inputs)
    assert len(tileops_calls(graph.graph)) == 1
    assert meta_target.builds == [] and meta_target.calls == []


@pytest.mark.parametrize("cls", ALL_OPS, ids=lambda c: c.__name__)
def test_torch_library_opcheck_passes(cls, cpu_target):
    op, inputs, _ = op_and_inputs(cls)
    custom = type(op)._custom_op
    params = [harness_param(p, op.params[p.name]) for p in type(op)._entry.params]
    extras = [op.extras.get(name) for name in extra_args(type(op))]
    torch.library.opcheck(custom, (*inputs, *params, *extras, ""))


def extra_args(cls):
    from tileops.ops._library import extra_args

    return extra_args(cls)


def harness_param(decl, value):
    from tileops.ops._library import _schema_param

    return _schema_param(decl, value)


def test_fake_tensors_get_manifest_shapes_without_a_kernel(meta_target):
    op = RMSNormFwdOp(normalized_shape=(64,))
    with FakeTensorMode():
        out = op(torch.empty(8, 64, dtype=torch.float16), torch.empty(64, dtype=torch.float16))
    assert out.shape == (8, 64) and out.dtype == torch.float16
    assert meta_target.builds == []


def test_torch_export_records_one_custom_op(cpu_target):
    op = RMSNormFwdOp(normalized_shape=(64,))

    class Model(torch.nn.Module):
        def forward(self, x, w):
            return op(x, w)

    x, w = torch.randn(4, 64, dtype=torch.float16), torch.randn(64, dtype=torch.float16)
    exported = torch.export.export(Model(), (x, w))
    assert tileops_calls(exported.graph) == ["tileops.rms_norm_fwd.default"]
    torch.testing.assert_close(exported.module()(x, w), op(x, w))


def test_a_dispatch_mode_sees_the_custom_op_on_plain_tensors(cpu_target):
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    op = RMSNormFwdOp(normalized_shape=(8,))
    x, w = torch.randn(2, 8, dtype=torch.float16), torch.randn(8, dtype=torch.float16)
    op(x, w)  # warm: the eager path has a memo entry now
    with Record():
        out = op(x, w)
    assert "tileops.rms_norm_fwd.default" in seen
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (8,), w, 1e-6))


def test_a_tensor_subclass_input_takes_the_custom_op_route(cpu_target):
    seen = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))

    x = torch.randn(2, 8).as_subclass(Logged)
    out = SiluFwdOp()(x)
    assert any("silu_fwd" in name for name in seen)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), torch.nn.functional.silu(x.as_subclass(torch.Tensor)))


def test_in_place_ops_trace_as_a_mutating_custom_op(cpu_target):
    op = SiluFwdOp(inplace=True)
    graph = make_fx(lambda x: op(x), tracing_mode="fake")(torch.randn(3, 3))
    assert tileops_calls(graph.graph) == ["tileops.silu_fwd_.default"]
