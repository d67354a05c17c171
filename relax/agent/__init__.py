"""Agentic multi-turn rollouts: environments, tools, trajectories with loss masks, the rollout driver, and the
warm-up batches of agent tasks (`relax.agent.train`, not imported here: it needs relax.tasks)."""

from relax.agent.env import Environment, MediaRef, Observation, Session, StepResult, ToolEnv
from relax.agent.rollout import MultiTurnRollout, cut_after
from relax.agent.tools import ToolBox, calculate, parse_tool_call, run_python
from relax.agent.trajectory import Trajectory, trajectory_rows

__all__ = ["Environment", "MediaRef", "MultiTurnRollout", "Observation", "Session", "StepResult", "ToolBox",
           "ToolEnv", "Trajectory", "calculate", "cut_after", "parse_tool_call", "run_python", "trajectory_rows"]
