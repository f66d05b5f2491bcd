"""Decoder LLMs on LPX: prefill and decode programs sharing one chip's SRAM (docs/llm.md)."""

from .session import DoesNotFit, LLMSession, compile_llm

__all__ = ["DoesNotFit", "LLMSession", "compile_llm"]
