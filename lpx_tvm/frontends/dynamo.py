"""``torch.compile(model, backend="lpx")``: a TorchDynamo backend that runs each captured
graph on the simulated LPX.

The package registers the backend under the name ``"lpx"`` through the
``torch_dynamo_backends`` entry point group, so ``torch.compile(m, backend="lpx")``
works without importing :mod:`lpx_tvm` first. ``options={"preset": ..., "precision":
...}`` picks the machine and the precision (default ``tsp``, ``fp16``).

For every graph TorchDynamo captures, the backend gets an FX ``GraphModule`` and
example inputs. The graph's parameters and buffers (lifted to graph inputs by
TorchDynamo) are bound as constants, the remaining inputs stay runtime inputs; the
graph is exported with ``torch.export``, imported into Relax and compiled with
:func:`lpx_tvm.build`, the same path as :func:`lpx_tvm.from_torch`. Compiled programs
are cached per input signature (shapes and dtypes): a call with new shapes compiles
again, and so does a call after a weight was changed in place or replaced. Python code
TorchDynamo cannot capture (a graph break) runs eagerly between the compiled graphs.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ..errors import LPXError
from ..relax_passes.errors import ModelError
from .torch import check_options, exported_to_relax, first_line, numpy_dtype, require_torch

__all__ = ["DynamoBackend", "LPXGraph", "dynamo_backend"]

OPTIONS = ("preset", "precision")


class DynamoBackend:
    """A TorchDynamo backend compiling captured graphs for LPX.

    ``torch.compile(m, backend=DynamoBackend(preset="mini", precision="fp32"))``, or the
    shared instance :data:`dynamo_backend` (registered as ``"lpx"``) with
    ``options={"preset": ..., "precision": ...}``, which override the instance's.

    Attributes
    ----------
    compilations : int
        LPX builds so far (one per captured graph and input signature).
    """

    def __init__(self, preset: str = "tsp", precision: str = "fp16"):
        check_options(preset, precision)
        self.preset = preset
        self.precision = precision
        self.compilations = 0
        self._graphs = []  # weak references: TorchDynamo's cache owns the graphs
        self._lock = threading.Lock()

    def __call__(self, graph_module, example_inputs, options=None, **kwargs):
        if kwargs:
            raise LPXError(f"the lpx backend takes options=, not {sorted(kwargs)}")
        preset, precision = self._options(options)
        graph = LPXGraph(graph_module, example_inputs, preset, precision, self)
        self._graphs.append(weakref.ref(graph))
        return graph

    @property
    def graphs(self) -> list:
        """The captured graphs still alive (TorchDynamo holds them until it resets)."""
        self._graphs = [g for g in self._graphs if g() is not None]
        return [g() for g in self._graphs]

    def _options(self, options):
        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise LPXError(f"unknown lpx backend option(s) {unknown}; the options are {list(OPTIONS)}")
        preset = options.get("preset", self.preset)
        precision = options.get("precision", self.precision)
        check_options(preset, precision)
        return preset, precision

    def _count(self):
        with self._lock:
            self.compilations += 1


class LPXGraph:
    """One captured graph: callable on torch tensors, compiled per input signature
    (:attr:`models`). Weights are the values the graph was compiled with; a call whose
    weights were replaced or changed in place compiles again."""

    def __init__(self, graph_module, example_inputs, preset, precision, backend=None):
        torch = require_torch()
        if not isinstance(graph_module, torch.fx.GraphModule):
            raise LPXError(f"the lpx backend expects a torch.fx.GraphModule, got {type(graph_module).__name__}")
        self.graph_module = graph_module
        self.preset = preset
        self.precision = precision
        self._compiled = {}  # input signature -> _Compiled
        self._backend = backend
        self._weights = None  # identity and version of the bound weights of self.models
        placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
        self.constant_positions = frozenset(i for i, n in enumerate(placeholders) if _is_weight(n))
        if _all_real(torch, example_inputs):
            self._compiled_for(list(example_inputs))

    @property
    def models(self) -> dict:
        """Input signature -> :class:`lpx_tvm.runtime.compiled_model.CompiledModel`."""
        return {key: c.model for key, c in self._compiled.items()}

    @property
    def last_model(self):
        """The model compiled last (its ``report`` describes its last run)."""
        return next(reversed(self._compiled.values())).model if self._compiled else None

    def __call__(self, *args):
        torch = require_torch()
        compiled = self._compiled_for(args)
        feeds = [a.detach().cpu().numpy() for i, a in enumerate(args)
                 if i not in self.constant_positions and isinstance(a, torch.Tensor)]
        outs = iter(compiled.model.executable.run(feeds))
        values = [torch.from_numpy(np.ascontiguousarray(next(outs))) if kind == "tensor" else value
                  for kind, value in compiled.leaves]
        return torch.utils._pytree.tree_unflatten(values, compiled.out_spec)

    def _compiled_for(self, args):
        weights = tuple((id(a), a.data_ptr(), a._version) for i, a in enumerate(args)
                        if i in self.constant_positions)
        if weights != self._weights:
            # A weight was replaced or changed in place: the constants compiled in are stale.
            self._compiled.clear()
            self._weights = weights
        key = self.signature(args)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compile(args)
            self._compiled[key] = compiled
            if self._backend is not None:
                self._backend._count()
        return compiled

    def signature(self, args) -> tuple:
        """Shapes and dtypes of the runtime inputs (values of integer inputs)."""
        torch = require_torch()
        sig = []
        for i, a in enumerate(args):
            if i in self.constant_positions:
                continue
            if isinstance(a, torch.Tensor):
                sig.append((tuple(int(d) for d in a.shape), str(a.dtype)))
            else:
                sig.append(("value", _concrete(a)))
        return tuple(sig)

    def _compile(self, args):
        from ..pipeline import compile_model
        from .torch import ImportedTorch

        torch = require_torch()
        wrapper = _bound_graph(torch, self.graph_module, args, self.constant_positions)
        tensors = wrapper.runtime_args(args)
        try:
            with torch.no_grad():
                exported = torch.export.export(wrapper, tuple(tensors), strict=False)
        except Exception as e:
            raise ModelError(
                f"captured graph: torch.export could not export it: {type(e).__name__}: {first_line(e)}"
            ) from e
        mod = exported_to_relax(exported, "captured graph")
        inputs = [(f"input_{k}", tuple(int(d) for d in t.shape), numpy_dtype(t.dtype)) for k, t in enumerate(tensors)]
        outputs = [f"output_{k}" for k in range(sum(kind == "tensor" for kind, _ in wrapper.leaves))]
        imported = ImportedTorch(mod=mod, inputs=inputs, outputs=outputs, exported_program=exported)
        model = compile_model(imported, self.preset, self.precision)
        return _Compiled(model, wrapper.leaves, wrapper.out_spec)


@dataclass
class _Compiled:
    model: object  # CompiledModel
    leaves: list  # per flattened output: ("tensor", None) or ("value", constant)
    out_spec: object  # the graph's output tree


def _make_bound_graph_class(torch):
    class BoundGraph(torch.nn.Module):
        """The captured graph with its weights as buffers and integer inputs fixed:
        ``forward`` takes only the runtime tensors."""

        def __init__(self, graph_module, args, constant_positions):
            super().__init__()
            self.graph_module = graph_module
            self.n = len(args)
            self.fixed = {}
            self.tensor_positions = []
            for i, a in enumerate(args):
                if i in constant_positions:
                    self.register_buffer(f"weight_{i}", a.detach(), persistent=True)
                elif isinstance(a, torch.Tensor):
                    self.tensor_positions.append(i)
                else:
                    self.fixed[i] = _concrete(a)

        def runtime_args(self, args):
            return [args[i].detach() for i in self.tensor_positions]

        def forward(self, *tensors):
            full = [None] * self.n
            for i, t in zip(self.tensor_positions, tensors):
                full[i] = t
            for i, v in self.fixed.items():
                full[i] = v
            for i in range(self.n):
                if full[i] is None:
                    full[i] = getattr(self, f"weight_{i}")
            # Shapes are static here, so a non-tensor output (a size the graph hands to
            # eager code, e.g. for a print) is a constant of this signature: keep it
            # aside and return the tensors only.
            leaves, self.out_spec = torch.utils._pytree.tree_flatten(self.graph_module(*full))
            self.leaves = [("tensor", None) if isinstance(x, torch.Tensor) else ("value", x) for x in leaves]
            return tuple(x for x in leaves if isinstance(x, torch.Tensor))

    return BoundGraph


_BOUND_GRAPH = []  # the class, made once torch is imported


def _bound_graph(torch, graph_module, args, constant_positions):
    if not _BOUND_GRAPH:
        _BOUND_GRAPH.append(_make_bound_graph_class(torch))
    return _BOUND_GRAPH[0](graph_module, args, constant_positions)


def _is_weight(node) -> bool:
    """A placeholder TorchDynamo lifted from a module's parameters or buffers."""
    grapharg = node.meta.get("grapharg")
    if grapharg is None or grapharg.source is None:
        return False
    from torch._dynamo.source import is_from_unspecialized_param_buffer_source

    return bool(is_from_unspecialized_param_buffer_source(grapharg.source))


def _all_real(torch, example_inputs) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    for a in example_inputs:
        if isinstance(a, FakeTensor) or isinstance(a, torch.SymInt):
            return False
        if isinstance(a, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in a.shape):
            return False
    return True


def _concrete(v):
    return int(v) if not isinstance(v, (float, bool)) else v


#: The backend registered as ``"lpx"`` (``tsp``, ``fp16`` unless ``options`` say otherwise).
dynamo_backend = DynamoBackend()
