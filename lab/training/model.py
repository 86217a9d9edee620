"""A small GPT: the decoder-only transformer the training facet trains on Shakespeare.

Architecture (GPT-2 style, pre-LayerNorm)::

    x = tok_emb(idx) + pos_emb(0..T-1)                       (B, T, d)
    for each block:  x = x + attn.proj(causal_sdpa(attn.qkv(ln1(x))))
                     x = x + mlp.proj(gelu(mlp.fc(ln2(x))))
    logits = head(ln_f(x))                                   (B, T, V)

Attention is :func:`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True``.
Every weight matrix is an :class:`torch.nn.Linear` with a stable name (``blocks.{i}.attn.qkv``,
``blocks.{i}.attn.proj``, ``blocks.{i}.mlp.fc``, ``blocks.{i}.mlp.proj``, ``head``), so per-layer
gradient hooks and GIFT find them with :meth:`GPT.linear_layers`.

The output head is **untied** from the token embedding: it is then an ``nn.Linear`` of its own
whose gradient is a plain weight gradient (GIFT whitens per linear layer, and the output layer is
where its gain concentrates; see ``../shared/notes/comm-check.md``); it costs ``V * d`` extra
parameters (22k at the default size).

Initialization: weights ~ N(0, 0.02), residual projections (``attn.proj``, ``mlp.proj``) ~
N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm 1/0; it is a pure function of the torch seed.

Sizes: :meth:`GPTConfig.default` (4 layers, d 256, 4 heads, context 128, vocab 85) has 3,235,840
parameters; :meth:`GPTConfig.tiny` (2 layers, d 32, 2 heads, context 32) has 31,936.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from lab.training.errors import ModelConfigError  # ModelConfigError is defined there, re-exported here

__all__ = ["GPT", "GPTConfig", "ModelConfigError"]


class GPTConfig(BaseModel):
    """Shape of a :class:`GPT`.

    Attributes
    ----------
    vocab_size : int or None
        Number of token ids; None means "take it from the tokenizer" (a training run fills it in);
        :class:`GPT` refuses None.
    block_size : int
        Longest context (tokens), also the position table's size.
    n_layer, n_head, d_model : int
        Blocks, attention heads, width (``d_model % n_head == 0``).
    dropout : float
        Dropout on attention weights and residual branches, in ``[0, 1)``; 0 (default) keeps every
        step a deterministic function of the parameters and the batch.
    bias : bool
        Biases in the Linear and LayerNorm layers.
    """

    model_config = ConfigDict(extra="forbid")

    vocab_size: int | None = Field(default=None, ge=2)
    block_size: int = Field(default=128, ge=1)
    n_layer: int = Field(default=4, ge=1)
    n_head: int = Field(default=4, ge=1)
    d_model: int = Field(default=256, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    bias: bool = True

    @model_validator(mode="after")
    def _heads_divide_width(self) -> GPTConfig:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        return self

    @classmethod
    def default(cls, vocab_size: int | None = None) -> GPTConfig:
        """4 layers, d 256, 4 heads, context 128 (about 3.2 M parameters with 85 tokens)."""
        return cls(vocab_size=vocab_size)

    @classmethod
    def tiny(cls, vocab_size: int | None = None) -> GPTConfig:
        """2 layers, d 32, 2 heads, context 32 (about 32 k parameters with 85 tokens): for tests."""
        return cls(vocab_size=vocab_size, block_size=32, n_layer=2, n_head=2, d_model=32)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_drop(self.proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer (see the module docstring).

    Parameters
    ----------
    config : GPTConfig
        With ``vocab_size`` set.

    Raises
    ------
    ModelConfigError
        ``config.vocab_size`` is None.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.vocab_size is None:
            raise ModelConfigError("GPTConfig.vocab_size is None: set it (a training run takes it from the tokenizer)")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model)
        self.stream = nn.Identity()  # names the residual stream's first value (GIFT's embedding factor hooks its gradient)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        """Number of scalar parameters."""
        return sum(p.numel() for p in self.parameters())

    def linear_layers(self) -> dict[str, nn.Linear]:
        """Every :class:`torch.nn.Linear` by its qualified name, in registration order."""
        return {name: m for name, m in self.named_modules() if isinstance(m, nn.Linear)}

    def embedding_layers(self) -> dict[str, tuple[nn.Embedding, nn.Module]]:
        """The embeddings and the module whose output gradient is their GIFT factor's source.

        Both embeddings are summed into the residual stream, ``x = tok_emb(idx) + pos_emb(0..T-1)``, and
        both weight gradients are built from the stream's gradient ``dL/dx``, shape ``(B, T, d)``
        (``pos_emb``'s own output gradient is its batch sum). The source is ``stream`` (an identity on
        ``x``): its output gradient arrives before either embedding's backward runs, so a DDP bucket
        holding either weight already has it (``tok_emb``'s output gradient can arrive after
        ``pos_emb``'s backward). Returns ``{"tok_emb": (tok_emb, stream), "pos_emb": (pos_emb, stream)}``.
        """
        return {"tok_emb": (self.tok_emb, self.stream), "pos_emb": (self.pos_emb, self.stream)}

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits and, given targets, the mean cross-entropy.

        Parameters
        ----------
        idx : torch.Tensor
            Token ids, shape ``(B, T)``, int64, ``T <= block_size``.
        targets : torch.Tensor, optional
            Next-token ids, shape ``(B, T)``, int64.

        Returns
        -------
        logits : torch.Tensor
            Shape ``(B, T, vocab_size)``, the parameters' dtype.
        loss : torch.Tensor or None
            Scalar, mean cross-entropy in nats per token (None without targets).

        Raises
        ------
        ModelConfigError
            ``T > block_size``.
        """
        B, T = idx.shape
        if T > self.config.block_size:
            raise ModelConfigError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.stream(self.tok_emb(idx) + self.pos_emb(pos)))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample ``max_new_tokens`` continuations of ``idx`` (shape ``(B, T0)`` int64) -> ``(B, T0 + max_new_tokens)``."""
        for _ in range(int(max_new_tokens)):
            logits, _ = self(idx[:, -self.config.block_size :])
            probs = F.softmax(logits[:, -1, :] / max(temperature, 1e-6), dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
        return idx
