"""The precisions a model compiles at: one enum that every stage reads."""

from __future__ import annotations

import enum

from .errors import LPXError


class Precision(enum.StrEnum):
    """``fp32``, ``fp16``, ``bf16``: the dtype of every stored value and MXM operand;
    ``int8``: a QDQ model's integer graph (values keep their own dtypes: int8, uint8, and
    float32 at the edges)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"

    @classmethod
    def parse(cls, value) -> "Precision":
        """A precision from its name; anything else is an error naming the choices."""
        try:
            return cls(value)
        except ValueError:
            raise LPXError(f"precision {value!r}: expected one of {', '.join(cls.names())}") from None

    @classmethod
    def names(cls) -> list:
        return [p.value for p in cls]

    @property
    def value_bytes(self) -> int:
        """Bytes of one stored element at this precision."""
        return {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}[self.value]
