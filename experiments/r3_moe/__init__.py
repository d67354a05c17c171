"""The R3 study (`relax study r3_moe`): overhead, log-prob mismatch and R3 off / on runs on a tiny Qwen3-MoE."""
