from relax.engines.torch_engine import Generation, TorchEngine, sample_tokens

__all__ = ["Generation", "TorchEngine", "sample_tokens"]
