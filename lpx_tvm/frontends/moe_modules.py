"""A sparse mixture-of-experts MLP for one token, written the way LPX runs it
(docs/moe.md): the router's top-k as k rounds of argmax and a one-hot mask, and each
chosen expert's SwiGLU as products by the matrix a runtime index names (the
``lpx.expert_dense`` composite), so that the program, and every cycle of it, is the same
whichever experts a token picks and no other expert's weights are installed."""

from __future__ import annotations

import torch

from ..relax_passes.errors import ModelError

# Subtracted from a chosen expert's logit so that the next round's argmax passes it: far
# beyond any logit, finite in fp16 (an infinity times a 0 of the mask would be NaN).
PASSED = 60000.0


class RoutedExperts(torch.nn.Module):
    """``sum_j w_j * down_j(act(gate_j(h)) * up_j(h))`` over the ``top_k`` experts of the
    router's softmax (Mixtral, Qwen3-MoE), ``w_j`` the chosen probabilities, divided by
    their sum when ``normalize`` (Mixtral always; Qwen3-MoE's ``norm_topk_prob``).

    Weights as transformers keeps them: ``router`` (E, H), ``gate_up`` (E, 2I, H) and
    ``down`` (E, H, I); ``act`` the experts' activation. Rows of ``h`` (1, H): one token."""

    def __init__(self, router, gate_up, down, top_k: int, normalize: bool, act):
        super().__init__()
        experts, two_i, hidden = gate_up.shape
        inner = two_i // 2
        if tuple(router.shape) != (experts, hidden) or two_i % 2 or tuple(down.shape) != (experts, hidden, inner):
            raise ModelError(f"experts of shapes router {tuple(router.shape)}, gate_up {tuple(gate_up.shape)}, "
                             f"down {tuple(down.shape)}: expected (E, H), (E, 2I, H) and (E, H, I)")
        if not 1 <= top_k <= experts:
            raise ModelError(f"top-{top_k} of {experts} experts: a token picks 1 to {experts}")
        stack = lambda w: torch.nn.Parameter(w.detach().transpose(1, 2).contiguous(), requires_grad=False)  # noqa: E731
        self.router = torch.nn.Parameter(router.detach().t().contiguous(), requires_grad=False)  # (H, E)
        self.gate, self.up = stack(gate_up[:, :inner]), stack(gate_up[:, inner:])  # (E, H, I) each
        self.down = stack(down)  # (E, I, H)
        self.register_buffer("columns", torch.arange(experts, dtype=torch.float32).reshape(1, experts))
        # A row's sum as a product (the MXM sums it: no lane reduction on the chain).
        self.register_buffer("ones", torch.ones(experts, 1))
        self.top_k, self.normalize, self.act = top_k, normalize, act

    @classmethod
    def from_block(cls, block) -> "RoutedExperts":
        """From transformers' ``MixtralSparseMoeBlock`` or ``Qwen3MoeSparseMoeBlock``."""
        router, experts = block.gate, block.experts
        return cls(router.weight, experts.gate_up_proj, experts.down_proj, router.top_k,
                   getattr(router, "norm_topk_prob", True), experts.act_fn)

    def _expert(self, h, e):
        def pick(stack):  # the chosen expert's matrix, installed by its index on LPX
            return torch.index_select(stack, 0, e).reshape(stack.shape[1:])
        return (self.act(h @ pick(self.gate)) * (h @ pick(self.up))) @ pick(self.down)

    def forward(self, h):
        if h.dim() != 2 or h.shape[0] != 1:
            raise ModelError(f"a sparse MoE MLP of {tuple(h.shape)} rows: RoutedExperts runs one token's row (1, H)")
        logits = h @ self.router  # (1, E)
        probs = torch.softmax(logits, -1)
        rest, picks, weights = logits, [], []
        for _ in range(self.top_k):
            e = rest.argmax(-1).to(torch.int32)  # (1,): the next expert
            chosen = torch.clamp(1.0 - torch.abs(self.columns - e.to(torch.float32).reshape(1, 1)), 0.0, 1.0)
            weights.append((probs * chosen) @ self.ones)  # its probability, (1, 1)
            rest = rest - chosen * PASSED
            picks.append(e)
        if self.normalize:
            total = weights[0]
            for w in weights[1:]:
                total = total + w
            weights = [w / total for w in weights]
        out = weights[0] * self._expert(h, picks[0])
        for w, e in zip(weights[1:], picks[1:]):
            out = out + w * self._expert(h, e)
        return (out, *picks)
