"""Generation backends. `base` is the interface (no torch); `hf.HFEngine` runs transformers models."""

from cleaner.engines.base import DetectorFactory, Engine, FinishReason, Generation, SamplingParams

__all__ = ["DetectorFactory", "Engine", "FinishReason", "Generation", "SamplingParams"]
