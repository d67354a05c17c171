"""veRL baseline: its real launch for a Relax experiment (`translate`) and its console log as results (`parse_log`).

veRL runs in its own environment or image, never in ours (it pins other transformers/tensordict versions).
"""

from baselines.verl.launch import MODES, translate
from baselines.verl.logs import parse_log

__all__ = ["MODES", "parse_log", "translate"]
