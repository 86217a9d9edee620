"""The training configuration the performance model predicts for (model shape + 3D parallelism).

Follows the configuration vector of Zhang et al., "Efficient Fine-Grained GPU Performance Modeling for
Distributed Deep Learning of LLM" (arXiv 2509.22832, HiPC 2025), Sec. III: ``[pp, mp, dp, b, h, l, dim,
steps_per_update]`` plus layers, vocabulary and precision. The model is the GPT of
:mod:`lab.training.model` (pre-LN, learned positions, biases, GeLU MLP of width ``4 d``, untied head);
``rope=True`` describes the RoPE variant of the paper's GPT-NeoX / LLaMA models instead.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["PerfConfig", "BYTES_PER_ELEMENT", "Precision"]

Precision = Literal["fp32", "tf32", "bf16", "fp16"]

#: Bytes of one element of the activations, weights and gradients in each precision.
BYTES_PER_ELEMENT: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}


class PerfConfig(BaseModel):
    """A GPT-style model and how one training step of it is distributed.

    Attributes
    ----------
    n_layer, d_model, n_head : int
        Transformer blocks, hidden size ``d``, attention heads ``h`` (``d % h == 0``).
    seq_len : int
        Tokens per sequence ``s`` (also the learned position table's size when ``rope`` is False).
    vocab_size : int
        Token ids ``V``; padded up to a multiple of ``vocab_multiple * tp`` (the paper pads to
        ``128 * mp``; 1, the default, is :mod:`lab.training.model`'s unpadded head).
    micro_batch : int
        Sequences per micro-batch ``b`` per data-parallel rank.
    n_micro_batches : int
        Micro-batches per optimizer step ``m`` (gradient accumulation steps).
    dp, tp, pp : int
        Data-, tensor- and pipeline-parallel degrees; the world has ``dp * tp * pp`` ranks. ``tp`` must
        divide ``n_head`` (column-parallel heads) and ``pp <= n_layer``.
    precision : {"fp32", "tf32", "bf16", "fp16"}
        Compute precision of matmuls, the dtype of activations and gradients (``tf32`` stores fp32).
    rope : bool
        Rotary position embedding on q and k (no learned position table) instead of learned positions.
    bias : bool
        Biases in the linears and LayerNorms (as :class:`lab.training.model.GPTConfig`).
    ffn_mult : int
        FFN width over ``d`` (4 in :mod:`lab.training.model`).
    zero1 : bool
        ZeRO-1: optimizer state sharded over DP; each DP rank steps ``1/dp`` of the parameters and
        the updated parameters are all-gathered (the paper's update phase, Sec. III-C).
    bucket_cap_mb : float
        Gradient bucket size of the DP all-reduce in MiB (``DistributedDataParallel``'s
        ``bucket_cap_mb``, default 25); the number of buckets is what overlap with backward works on.
    layers_per_stage : list of int, optional
        Blocks on each pipeline stage (``len == pp``, each >= 1, sum ``n_layer``). Default: as even as
        possible, earlier stages take the remainder.

    Raises
    ------
    pydantic.ValidationError
        A non-positive size, ``d_model % n_head``, ``n_head % tp``, ``pp > n_layer`` or a bad
        ``layers_per_stage``; the message names the field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_layer: int = Field(ge=1)
    d_model: int = Field(ge=1)
    n_head: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    vocab_size: int = Field(ge=2)
    micro_batch: int = Field(default=1, ge=1)
    n_micro_batches: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    precision: Precision = "fp32"
    rope: bool = False
    bias: bool = True
    ffn_mult: int = Field(default=4, ge=1)
    vocab_multiple: int = Field(default=1, ge=1)
    zero1: bool = False
    bucket_cap_mb: float = Field(default=25.0, gt=0)
    layers_per_stage: tuple[int, ...] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PerfConfig:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.n_head % self.tp:
            raise ValueError(f"n_head ({self.n_head}) must be divisible by tp ({self.tp})")
        if self.pp > self.n_layer:
            raise ValueError(f"pp ({self.pp}) exceeds n_layer ({self.n_layer}): every stage needs a block")
        if self.layers_per_stage is not None:
            lps = self.layers_per_stage
            if len(lps) != self.pp or min(lps) < 1 or sum(lps) != self.n_layer:
                raise ValueError(f"layers_per_stage {list(lps)} must have pp={self.pp} entries >= 1 "
                                 f"summing to n_layer={self.n_layer}")
        return self

    @property
    def world_size(self) -> int:
        """``dp * tp * pp`` ranks."""
        return self.dp * self.tp * self.pp

    @property
    def bytes_per_element(self) -> int:
        """Bytes per activation / weight / gradient element in :attr:`precision`."""
        return BYTES_PER_ELEMENT[self.precision]

    @property
    def padded_vocab(self) -> int:
        """``V`` rounded up to a multiple of ``vocab_multiple * tp`` (Megatron / the paper's padding)."""
        q = self.vocab_multiple * self.tp
        return -(-self.vocab_size // q) * q

    def stage_layers(self) -> list[int]:
        """Blocks per pipeline stage, ``len == pp``."""
        if self.layers_per_stage is not None:
            return list(self.layers_per_stage)
        base, extra = divmod(self.n_layer, self.pp)
        return [base + (1 if i < extra else 0) for i in range(self.pp)]

    @classmethod
    def from_gpt_config(cls, gpt, **parallel) -> PerfConfig:
        """The configuration of a :class:`lab.training.model.GPTConfig` (``seq_len = block_size``).

        Parameters
        ----------
        gpt : lab.training.model.GPTConfig
            With ``vocab_size`` set.
        **parallel
            Any other field (``micro_batch``, ``dp``, ``precision``, ``seq_len``, ...).
        """
        fields = dict(n_layer=gpt.n_layer, d_model=gpt.d_model, n_head=gpt.n_head, seq_len=gpt.block_size,
                      vocab_size=gpt.vocab_size, bias=gpt.bias)
        fields.update(parallel)
        return cls(**fields)
