"""OpenRLHF baseline: its real launch for a Relax experiment (`translate`) and its console log as results
(`parse_log`). OpenRLHF runs in its own environment or image, never in ours.
"""

from baselines.openrlhf.launch import MODES, translate
from baselines.openrlhf.logs import parse_log

__all__ = ["MODES", "parse_log", "translate"]
