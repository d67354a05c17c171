"""Omni-modal data path and a tiny CPU omni model: processors (image / audio / video -> feature fields),
offline media tasks, TinyOmni (tiny Qwen3 + encoders + projectors), OmniEngine, and a standalone runner."""
