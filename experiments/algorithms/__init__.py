"""The algorithm-comparison study (`relax study algorithms`): GRPO, GSPO, SAPO, OPD, PPO + Critic from one warm-up."""
